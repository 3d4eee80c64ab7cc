import Foundation
import Testing
import Tether
import TetherSync
import TetherTestSupport
import TetherWire

/// The schema and every row of every table, `tether_*` included: what must not change. Not the
/// certificate pins: a handshake records the peer's certificate whatever the frames that follow it.
private func snapshot(_ db: Database) throws -> [String] {
    let tables = try db.fetchRows(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name != 'tether_peer_certificates' ORDER BY name"
    )
    .map { try $0.get(0, as: String.self) }
    return try ["SELECT type, name, sql FROM sqlite_master ORDER BY type, name"]
        + tables.map { "SELECT '\($0)', * FROM \"\($0)\"" }
        .flatMap { sql in try db.fetchRows(sql).map { $0.values.map(\.description).joined(separator: "|") } }
}

/// The bytes of an invalid test vector (Protocol/vectors/invalid/NAME.hex).
func invalidVector(_ name: String) throws -> [UInt8] {
    let url = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()
        .appendingPathComponent("Protocol/vectors/invalid/\(name).hex")
    let hex = try String(contentsOf: url, encoding: .utf8).filter(\.isHexDigit)
    var bytes: [UInt8] = []
    var index = hex.startIndex
    while index < hex.endIndex {
        let next = hex.index(index, offsetBy: 2)
        guard let byte = UInt8(hex[index..<next], radix: 16) else { throw CocoaError(.fileReadCorruptFile) }
        bytes.append(byte)
        index = next
    }
    return bytes
}

/// A batch of `count` real changes from another database with the same schema.
private func realBatch(rows count: Int) throws -> ChangeBatch {
    let source = try makeDatabase()
    try source.write { conn in
        for id in 1...count {
            try conn.execute("INSERT INTO t (id, name, n) VALUES (?, ?, ?)", [id + 1000, "hostile-\(id)", id])
        }
    }
    return try source.extractChanges(for: nil, after: 0)
}

@Suite("Sync sessions: hostile frames after the handshake")
struct HostileFrameTests {
    /// Runs a server on a database with rows, lets a peer complete the handshake (offering
    /// `capabilities`, the server's if nil) and send `bytes`, then answer the server's PULL with the
    /// BATCH `answer` makes (given the server and the peer's instance key), if any; returns what the
    /// server sent and how its session ended, after checking the database did not change.
    private func exchange(
        sending bytes: [UInt8] = [], capabilities: Capabilities? = nil, closeAfterSending: Bool = false,
        answeringPull answer: ((Database, InstanceKey) throws -> ChangeBatch)? = nil
    )
        async throws -> (messages: [WireMessage], result: Result<SyncSummary, SyncSessionError>?)
    {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeDatabase()
        try await server.write { conn in
            for id in 1...20 {
                try conn.execute("INSERT INTO t (id, name, n) VALUES (?, ?, ?)", [id, "server-\(id)", id])
            }
        }
        let before = try snapshot(server)
        let impostor = try makeDatabase().instanceKey
        let batch =
            try answer.map { try FrameEncoder(compression: false).encode(.batch(try $0(server, impostor))) } ?? []
        let (messages, result) = try await runServer(server, pki: pki) { syncServer in
            try await silentExchange(
                port: syncServer.port, pki: pki, mirrorAs: impostor, capabilities: capabilities,
                afterHello: bytes, afterPull: batch, closeAfterSending: closeAfterSending)
        }
        let after = try snapshot(server)
        #expect(after == before, "the database changed: \(Set(after).symmetricDifference(before).sorted())")
        return (messages, result)
    }

    /// The server's last message is ERROR `code`, and its session failed with a malformed frame matching `matches`.
    private func expectClosed(
        _ outcome: (messages: [WireMessage], result: Result<SyncSummary, SyncSessionError>?),
        code: WireErrorCode, _ matches: (WireError) -> Bool
    ) {
        guard case let .error(received, text) = outcome.messages.last else {
            Issue.record("the server's last message is not ERROR: \(outcome.messages)")
            return
        }
        #expect(received == code, "\(text)")
        guard case let .failure(.malformedFrame(error))? = outcome.result else {
            Issue.record(
                "the server's session did not fail with a malformed frame: \(String(describing: outcome.result))")
            return
        }
        #expect(matches(error), "\(error)")
    }

    @Test("an oversized frame (length above 16 MiB) gets ERROR frameTooLarge from its 4 length bytes alone")
    func oversized() async throws {
        let outcome = try await exchange(sending: [0x01, 0x00, 0x00, 0x01, 0x06, 0x00])
        expectClosed(outcome, code: .frameTooLarge) {
            if case .frameTooLarge = $0 { return true } else { return false }
        }
    }

    @Test("a decompression bomb (raw length above 64 MiB) gets ERROR decompressionFailed before anything is allocated")
    func decompressionBomb() async throws {
        let outcome = try await exchange(sending: try invalidVector("decompression-bomb"))
        expectClosed(outcome, code: .decompressionFailed) {
            if case .decompressedSizeTooLarge = $0 { return true } else { return false }
        }
    }

    @Test("a corrupt LZ4 block gets ERROR decompressionFailed")
    func corruptCompression() async throws {
        let outcome = try await exchange(sending: try invalidVector("corrupt-lz4"))
        expectClosed(outcome, code: .decompressionFailed) {
            if case .decompressionFailed = $0 { return true } else { return false }
        }
    }

    @Test("a BATCH whose body is corrupted (bad magic) gets ERROR malformedFrame, and nothing of it is applied")
    func corruptedBatch() async throws {
        let outcome = try await exchange(sending: try invalidVector("batch-bad-magic"))
        expectClosed(outcome, code: .malformedFrame) { if case .batch = $0 { return true } else { return false } }
    }

    @Test("a real BATCH with one byte flipped in its changes is refused whole")
    func flippedByteInBatch() async throws {
        var uncompressed = try FrameEncoder(compression: false).encode(.batch(try realBatch(rows: 50)))
        // Past the header and the batch's fixed fields: into the changes. A tag byte of 0xEE is never valid.
        uncompressed[uncompressed.count - 3] = 0xEE
        let outcome = try await exchange(sending: uncompressed)
        expectClosed(outcome, code: .malformedFrame) { if case .batch = $0 { return true } else { return false } }
    }

    @Test("a compressed frame when LZ4 was not negotiated gets ERROR malformedFrame")
    func compressedBeforeNegotiation() async throws {
        let bye = try FrameEncoder(compression: true).encode(
            .bye(reason: String(repeating: "compress me ", count: 100)))
        #expect(bye[5] & 1 == 1, "the test frame is not compressed")
        let outcome = try await exchange(sending: bye, capabilities: [])
        expectClosed(outcome, code: .malformedFrame) {
            if case .compressionNotAllowed = $0 { return true } else { return false }
        }
    }

    /// The server's last message is ERROR batchRejected, and its session failed with a rejected batch;
    /// both name `rule`.
    private func expectRejected(
        _ outcome: (messages: [WireMessage], result: Result<SyncSummary, SyncSessionError>?), naming rule: String
    ) {
        guard case let .error(code, text) = outcome.messages.last else {
            Issue.record("the server's last message is not ERROR: \(outcome.messages)")
            return
        }
        #expect(code == .batchRejected && text.contains(rule), "\(code): \(text)")
        guard case let .failure(.batchRejected(reason))? = outcome.result else {
            Issue.record(
                "the server's session did not fail with a rejected batch: \(String(describing: outcome.result))")
            return
        }
        #expect(reason.contains(rule), "\(reason)")
    }

    /// One change to row 1 of `t` from `peer`, ten minutes ahead (within the hour a peer's clock may be ahead).
    private func changeToRow1(from peer: InstanceKey, existence origin: InstanceKey, columns: [String]) -> ChangeBatch {
        let version = Version(
            timestamp: HybridTimestamp(milliseconds: UInt64(Date().timeIntervalSince1970 * 1000) + 600_000, counter: 0),
            origin: origin)
        let values: [DatabaseValue] = columns.map { $0 == "name" ? .text("hostile") : .integer(666) }
        return ChangeBatch(
            source: peer, after: 0, through: 1, isLast: true,
            tables: [TableDescriptor(name: "t", keyColumns: ["id"], valueColumns: columns)],
            changes: [
                RowChange(
                    table: 0, key: [.integer(1)], isAlive: true, existence: version, values: values, versions: [],
                    sequence: 1)
            ])
    }

    @Test(
        "a BATCH forging the server's own writes gets ERROR batchRejected naming the rule, and nothing of it is applied"
    )
    func forgedOwnWrites() async throws {
        let outcome = try await exchange { server, impostor in
            changeToRow1(from: impostor, existence: server.instanceKey, columns: ["name", "n"])
        }
        expectRejected(outcome, naming: "forged change")
    }

    @Test("a BATCH identifying the server's table by other key columns gets ERROR batchRejected; nothing is written")
    func tableWithOtherKeyColumns() async throws {
        let outcome = try await exchange { _, impostor in
            var batch = changeToRow1(from: impostor, existence: impostor, columns: ["n"])
            batch.tables = [TableDescriptor(name: "t", keyColumns: ["name"], valueColumns: ["n"])]
            batch.changes[0].key = [.text("server-1")]
            return batch
        }
        expectRejected(outcome, naming: "table t is identified by (name) on the peer and by (id) here")
    }

    @Test("a BATCH whose sequence numbers do not increase gets ERROR malformedFrame from the decoder")
    func sequencesNotIncreasing() async throws {
        let outcome = try await exchange(sending: try invalidVector("batch-sequence-not-increasing"))
        expectClosed(outcome, code: .malformedFrame) { error in
            if case .batch(.invalid(.sequenceNotIncreasing)) = error { return true } else { return false }
        }
    }

    @Test("a BATCH frame cut short by the connection closing is not applied; the session reports the closed connection")
    func truncatedBatch() async throws {
        let frame = try FrameEncoder(compression: true).encode(.batch(try realBatch(rows: 50)))
        let outcome = try await exchange(sending: Array(frame.dropLast(20)), closeAfterSending: true)
        guard case .failure(.connectionClosed)? = outcome.result else {
            Issue.record(
                "the server's session did not end with the closed connection: \(String(describing: outcome.result))")
            return
        }
    }
}
