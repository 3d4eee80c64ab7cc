/// What tests change in observation's behaviour, kept apart from what a user configures
/// (`ObservationBroker.testHooks` is internal: reachable only with `@testable import`). Each hook
/// is taken when it fires: it fires once.
struct ObservationTestHooks: Sendable {
    /// The moments, on the writer, between reads that place a subscription in the changelog: a
    /// commit of another connection landing there must be told once, neither twice nor late.
    enum SubscriptionStep: Sendable, CaseIterable, CustomStringConvertible {
        /// As the broker activates: between reading where the changelog ends and the data version.
        case activating
        /// A stream resuming after a sequence number: once the broker is active, before its catch-up.
        case beforeCatchUp
        /// A stream resuming after a sequence number: between reading where the changelog ends
        /// and reading the changes since the sequence number.
        case catchingUp

        var description: String {
            switch self {
            case .activating: "activating"
            case .beforeCatchUp: "before the catch-up"
            case .catchingUp: "catching up"
            }
        }
    }

    /// Called on the writer when a subscription reaches `step`.
    var subscription: (step: SubscriptionStep, body: @Sendable () -> Void)?
    /// Thrown by the next read-back of other connections' commits that finds one to read, before
    /// it reads, as a busy database or a failing disk would.
    var readBackFailure: DatabaseError?
}

extension ObservationBroker {
    /// Runs the subscription hook waiting for `step`, once.
    func subscriptionReached(_ step: ObservationTestHooks.SubscriptionStep) {
        let hook = testHooks.withLock { hooks -> (@Sendable () -> Void)? in
            guard let hook = hooks.subscription, hook.step == step else { return nil }
            hooks.subscription = nil
            return hook.body
        }
        hook?()
    }

    /// Throws the read-back failure a test asked for, once.
    func injectedReadBackFailure() throws {
        let failure = testHooks.withLock { hooks in
            defer { hooks.readBackFailure = nil }
            return hooks.readBackFailure
        }
        if let failure { throw failure }
    }
}
