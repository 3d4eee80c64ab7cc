// swift-tools-version:6.0
import PackageDescription

// Benchmarks live in their own package so that Tether itself depends on
// nothing that only the comparisons need (GRDB).
let package = Package(
    name: "TetherBenchmarks",
    platforms: [.macOS(.v14)],
    dependencies: [
        .package(name: "Tether", path: ".."),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        // The load lines drive a hostile peer of their own (a raw NIO client).
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.0"),
    ],
    targets: [
        // The system SQLite, for the raw C API baselines.
        .systemLibrary(
            name: "BenchSQLite", path: "Sources/BenchSQLite", pkgConfig: "sqlite3",
            providers: [.apt(["libsqlite3-dev"])]),
        // The system liblz4, to compress the session extension's patchsets
        // as the wire codec compresses its frames (LZ4_compress_default).
        .systemLibrary(
            name: "BenchLZ4", path: "Sources/BenchLZ4", pkgConfig: "liblz4",
            providers: [.apt(["liblz4-dev"])]),
        // The C function every line's timed part runs in (see its header): the symbol the
        // instruction-count mode has callgrind count in.
        .target(name: "BenchRegion", path: "Sources/BenchRegion"),
        .executableTarget(
            name: "TetherBenchmarks",
            dependencies: [
                "BenchSQLite", "BenchLZ4", "BenchRegion",
                .product(name: "Tether", package: "Tether"),
                .product(name: "TetherSync", package: "Tether"),
                .product(name: "TetherWire", package: "Tether"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            ]),
    ],
    swiftLanguageModes: [.v6]
)
