import Foundation
import Testing
import TetherBatch
@testable import TetherWire

/// The frozen vectors in Protocol/vectors: each valid one decodes to what the
/// manifest says and re-encodes byte for byte; each invalid one gives its error.
@Suite struct VectorTests {
    static let vectorDirectory = protocolDirectory.appendingPathComponent("vectors")
    static let manifestURL = vectorDirectory.appendingPathComponent("manifest.json")

    static func manifest() throws -> [ManifestEntry] {
        try JSONDecoder().decode([ManifestEntry].self, from: Data(contentsOf: manifestURL))
    }

    static func bytes(of entry: ManifestEntry) throws -> [UInt8] {
        let text = try String(contentsOf: vectorDirectory.appendingPathComponent(entry.file), encoding: .utf8)
        return try #require(Hex.decode(text), "\(entry.file) is not hex")
    }

    @Test func validVectorsDecodeAndReencodeByteForByte() throws {
        let entries = try Self.manifest().filter(\.valid)
        #expect(entries.count >= 15)
        var typesSeen = Set<MessageType>()
        var compressedTypes = Set<MessageType>()
        for entry in entries {
            let frame = try Self.bytes(of: entry)
            let message = try FrameDecoder.decode(frame: frame)
            typesSeen.insert(message.type)
            #expect(MessageJSON.describe(message) == entry.message, "\(entry.file)")
            #expect(entry.compressed == (frame[5] & 1 != 0), "\(entry.file)")
            if entry.compressed == true { compressedTypes.insert(message.type) }
            let encoder = FrameEncoder(
                compression: entry.encoderCompression ?? false, columnarBatches: entry.encoderColumnarBatches ?? false,
                compactColumns: entry.encoderCompactColumns ?? false)
            // Compressed vectors were made by liblz4 1.9's LZ4_compress_default; another
            // compressor may choose other (equally valid) matches.
            #expect(try encoder.encode(message) == frame, "\(entry.file) re-encodes differently")
            // The stream decoder agrees.
            var decoder = FrameDecoder()
            decoder.append(frame)
            #expect(try decoder.nextMessage() == message)
            #expect(try decoder.nextMessage() == nil)
        }
        #expect(typesSeen == Set(MessageType.allCases))
        #expect(compressedTypes.contains(.batch))
    }

    @Test func invalidVectorsGiveTheirErrors() throws {
        let entries = try Self.manifest().filter { !$0.valid }
        #expect(entries.count >= 20)
        for entry in entries {
            let frame = try Self.bytes(of: entry)
            do {
                let message = try FrameDecoder.decode(frame: frame)
                Issue.record("\(entry.file) decoded to \(message)")
            } catch {
                #expect(error.caseName == entry.error, "\(entry.file): \(error)")
                #expect(Int(error.code.rawValue) == entry.code, "\(entry.file)")
                #expect(error.description == entry.errorDescription, "\(entry.file)")
            }
            var decoder = FrameDecoder()
            decoder.append(frame)
            switch entry.stream {
            case .sameError?:
                do {
                    let message = try decoder.nextMessage()
                    Issue.record("\(entry.file): stream decoder gave \(String(describing: message))")
                } catch {
                    #expect(error.description == entry.errorDescription, "\(entry.file)")
                }
            case .needsMoreBytes?:
                #expect(try decoder.nextMessage() == nil, "\(entry.file)")
            case .messageThenNeedsMoreBytes?:
                #expect(try decoder.nextMessage() != nil, "\(entry.file)")
                #expect(try decoder.nextMessage() == nil, "\(entry.file)")
            case nil:
                Issue.record("\(entry.file) has no stream behaviour")
            }
        }
    }

    /// Every file is in the manifest, and the catalog still makes exactly the frozen files.
    @Test func catalogMatchesFrozenFiles() throws {
        let entries = try Self.manifest()
        var files: [String] = []
        for folder in ["valid", "invalid"] {
            let names = try FileManager.default.contentsOfDirectory(
                atPath: Self.vectorDirectory.appendingPathComponent(folder).path)
            files += names.filter { $0.hasSuffix(".hex") }.map { "\(folder)/\($0)" }
        }
        #expect(Set(files) == Set(entries.map(\.file)))
        let catalog = try VectorCatalog.all()
        #expect(catalog.map(VectorCatalog.manifestEntry) == entries)
        for vector in catalog {
            let frozen = try Self.bytes(of: VectorCatalog.manifestEntry(vector))
            #expect(frozen == vector.bytes, "\(vector.file) differs from the catalog")
        }
    }

    @Test(.enabled(if: ProcessInfo.processInfo.environment["TETHER_WRITE_VECTORS"] == "1"))
    func writeVectors() throws {
        let manager = FileManager.default
        for folder in ["valid", "invalid"] {
            let url = Self.vectorDirectory.appendingPathComponent(folder)
            try? manager.removeItem(at: url)
            try manager.createDirectory(at: url, withIntermediateDirectories: true)
        }
        let vectors = try VectorCatalog.all()
        for vector in vectors {
            try Hex.encode(vector.bytes).write(
                to: Self.vectorDirectory.appendingPathComponent(vector.file), atomically: true, encoding: .utf8)
        }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        var json = try encoder.encode(vectors.map(VectorCatalog.manifestEntry))
        json.append(0x0A)
        try json.write(to: Self.manifestURL)
    }
}
