import NIOConcurrencyHelpers

/// The options the next session of a server or of a link starts with. Each session reads them
/// once, as it starts, and keeps them to its end; `SyncServer.replaceOptions` and
/// `SyncNode.replaceOptions` replace them for the sessions after (what `tether serve` does on
/// SIGHUP). Shared by a node's server and links, so that one replacement reaches all of them.
final class NextSessionOptions: Sendable {
    private let options: NIOLockedValueBox<SyncOptions>

    init(_ options: SyncOptions) {
        self.options = NIOLockedValueBox(options)
    }

    /// The options a session starting now takes.
    var current: SyncOptions { options.withLockedValue { $0 } }

    /// The sessions that start from now on take `options`.
    func replace(with options: SyncOptions) {
        self.options.withLockedValue { $0 = options }
    }
}
