// swift-tools-version:6.0
import CompilerPluginSupport
import PackageDescription

let package = Package(
    name: "Tether",
    platforms: [.macOS(.v14)],
    products: [
        .library(name: "Tether", targets: ["Tether"]),
        .library(name: "TetherSync", targets: ["TetherSync"]),
        .library(name: "TetherWire", targets: ["TetherWire"]),
        .executable(name: "tether", targets: ["tether"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.0"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.0"),
        // TetherSync and the engine's background work log through the swift-log API (a Logger the
        // caller passes, a no-op one by default); the `tether` CLI picks the handler and the level.
        .package(url: "https://github.com/apple/swift-log", from: "1.16.0"),
        // SyncServer and SyncLink are `Service`s; `tether serve` runs them in a `ServiceGroup`.
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        // TetherSync records through the swift-metrics API; the `tether` CLI exports to Prometheus.
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
        // Only the @Model macro's compiler plugin uses it; nothing links it at run time.
        .package(url: "https://github.com/swiftlang/swift-syntax", from: "603.0.1"),
        // `swift package generate-documentation` (the DocC catalogs of Tether and TetherSync).
        .package(url: "https://github.com/swiftlang/swift-docc-plugin", from: "1.5.0"),
    ],
    targets: [
        // System libraries, found through pkg-config; the apt providers are what
        // Scripts/test.sh installs on a fresh Debian machine.
        .systemLibrary(
            name: "CSQLite", path: "Sources/CSQLite", pkgConfig: "sqlite3",
            providers: [.apt(["libsqlite3-dev"])]),
        .systemLibrary(
            name: "CLZ4", path: "Sources/CLZ4", pkgConfig: "liblz4",
            providers: [.apt(["liblz4-dev"])]),
        .systemLibrary(
            name: "COpenSSL", path: "Sources/COpenSSL", pkgConfig: "openssl",
            providers: [.apt(["libssl-dev"])]),
        // The change batch and its values (DatabaseValue, InstanceKey, versions) with their
        // binary codec: the leaf both the database and the wire codec build on. Foundation only.
        .target(name: "TetherBatch"),
        // Logging (swift-log's API only: no handler, no I/O, Foundation-free) because the engine
        // works on its own — the expiry timer deletes rows with no caller to throw to — and a
        // failure there must reach the operator rather than vanish.
        .target(
            name: "Tether",
            dependencies: ["TetherBatch", "CSQLite", "TetherMacros", .product(name: "Logging", package: "swift-log")]),
        // @Model: generates a model's direct column reading and binding (ColumnCodable).
        .macro(
            name: "TetherMacros",
            dependencies: [
                .product(name: "SwiftSyntaxMacros", package: "swift-syntax"),
                .product(name: "SwiftCompilerPlugin", package: "swift-syntax"),
            ]),
        // The sync transport: TLS over SwiftNIO, done by the system's OpenSSL.
        .target(
            name: "TetherSync",
            dependencies: [
                "Tether", "TetherWire", "COpenSSL",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]),
        // The wire protocol's pure codec (frames, messages, LZ4): no I/O. Specified in Protocol/.
        .target(name: "TetherWire", dependencies: ["TetherBatch", "CLZ4"]),
        .executableTarget(
            name: "tether",
            dependencies: [
                "Tether", "TetherSync",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]),
        // A child process for tests: the crash-safety tests kill it with SIGKILL; the file watch
        // tests commit through it from another process.
        .executableTarget(
            name: "TetherTestWorker", dependencies: ["Tether", "TetherTestSupport"], path: "Tests/TetherTestWorker"),
        // What the test targets share: temporary directories, databases, waiting for a condition,
        // the in-process sync loop, a recorder of what is logged. Tether and swift-log's API alone,
        // so that the library's own tests link no NIO.
        .target(
            name: "TetherTestSupport", dependencies: ["Tether", .product(name: "Logging", package: "swift-log")],
            path: "Tests/TetherTestSupport"),
        // Fixtures: database files made by earlier versions, read by the upgrade tests.
        .testTarget(
            name: "TetherTests", dependencies: ["Tether", "TetherTestSupport", "TetherTestWorker"],
            exclude: ["Fixtures"]),
        .testTarget(
            name: "TetherSyncTests",
            dependencies: [
                "TetherSync", "TetherTestSupport", "COpenSSL",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "MetricsTestKit", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "ServiceLifecycleTestKit", package: "swift-service-lifecycle"),
            ]),
        .testTarget(name: "TetherWireTests", dependencies: ["TetherWire", "TetherBatch"]),
        .testTarget(
            name: "TetherMacroTests",
            dependencies: [
                "TetherMacros",
                .product(name: "SwiftSyntaxMacrosTestSupport", package: "swift-syntax"),
            ]),
        // Runs the built `tether` executable as separate processes.
        .testTarget(name: "TetherCLITests", dependencies: ["tether", "Tether", "TetherSync", "TetherTestSupport"]),
    ],
    swiftLanguageModes: [.v6]
)
