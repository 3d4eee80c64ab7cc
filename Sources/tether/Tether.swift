import ArgumentParser

/// The `tether` command: Tether without writing Swift.
@main
struct TetherCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tether",
        abstract: "An embedded SQLite ORM with a replication engine: tools and demo.",
        subcommands: [Demo.self])
}
