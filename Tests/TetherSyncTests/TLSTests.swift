import Foundation
import NIOCore
import NIOPosix
import Testing
import TetherSync

/// Application bytes a refused peer tries to send; they must never arrive.
private let secret = Array("secret application data".utf8)

/// Connects a client made from `client` to a server made from `server`, has the
/// client write `secret` at once (held by its TLSHandler until the handshake is
/// done), and waits until both ends have closed.
private func refusedConnection(
    server: TLSContext, client: TLSContext
) async throws -> (server: ConnectionLog, client: ConnectionLog) {
    try await withServer(server) { testServer in
        let (channel, clientLog) = try await testServer.connect(client)
        channel.send(secret).whenComplete { _ in }
        let serverLog = try await testServer.firstConnection()
        try await awaitResult(serverLog.closed.futureResult, "the server end to close")
        try await awaitResult(clientLog.closed.futureResult, "the client end to close")
        return (serverLog, clientLog)
    }
}

/// Nothing reached either application, and the side that refused said why.
private func expectNothingDelivered(
    _ logs: (server: ConnectionLog, client: ConnectionLog), sourceLocation: SourceLocation = #_sourceLocation
) {
    #expect(logs.server.received.isEmpty, "the server application received data", sourceLocation: sourceLocation)
    #expect(logs.client.received.isEmpty, "the client application received data", sourceLocation: sourceLocation)
    #expect(logs.server.handshake == nil, "the server completed the handshake", sourceLocation: sourceLocation)
    #expect(!logs.client.snapshot.errors.isEmpty, "the client saw no error", sourceLocation: sourceLocation)
}

/// The refused client was told why by the server's alert. (Should a TCP reset
/// overtake the alert, because the server closed with the client's data unread,
/// the client sees the reset instead: accepted, as it is no fault of the handler.)
private func expectClientSawAlert(
    _ log: ConnectionLog, _ alert: String, sourceLocation: SourceLocation = #_sourceLocation
) {
    let tlsErrors = log.tlsErrors
    if tlsErrors == [.peerAlert(reason: alert)] { return }
    let resetInstead =
        !log.otherErrors.isEmpty && tlsErrors.allSatisfy { $0 == .uncleanShutdown || $0 == .closedDuringHandshake }
    #expect(
        resetInstead, "the client saw \(log.snapshot.errors), not the alert \(alert)", sourceLocation: sourceLocation)
}

@Suite("TLS transport")
struct TLSTransportTests {
    @Test("mutual TLS 1.3 handshake, then data echoed both ways across several records")
    func mutualHandshakeAndEcho() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        // 200 KB in three writes, one larger than the handler's 64 KiB SSL_write chunk:
        // many TLS records (at most 16 KiB each) each way.
        let payload = (0..<200_000).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 8) }
        try await withServer(try pki.serverContext()) { server in
            let (channel, clientLog) = try await server.connect(try pki.clientContext(), expectedBytes: payload.count)
            // Written before the handshake completes: the handler holds them until then.
            channel.send(Array(payload[0..<20_000])).whenComplete { _ in }
            channel.send(Array(payload[20_000..<170_000])).whenComplete { _ in }
            let lastWrite = channel.send(Array(payload[170_000...]))

            let clientHandshake = try await awaitResult(
                clientLog.handshakeCompleted.futureResult, "the client handshake")
            let serverLog = try await server.firstConnection()
            let serverHandshake = try await awaitResult(
                serverLog.handshakeCompleted.futureResult, "the server handshake")
            try await awaitResult(lastWrite, "the client's writes")
            let echoed = try await awaitResult(clientLog.receivedExpected.futureResult, "the echo")

            #expect(echoed == payload)
            #expect(serverLog.received == payload)
            #expect(clientHandshake.protocolVersion == .tls13)
            #expect(clientHandshake.protocolVersion.description == "TLSv1.3")
            #expect(serverHandshake.protocolVersion == .tls13)
            #expect(clientHandshake.peerFingerprint == pki.server.fingerprint)
            #expect(serverHandshake.peerFingerprint == pki.client.fingerprint)
            #expect(clientHandshake.peerSubject == "CN=node-server")
            #expect(serverHandshake.peerSubject == "CN=node-client")
            #expect(clientHandshake.cipherSuite.hasPrefix("TLS_"))
            #expect(clientLog.tlsErrors.isEmpty)
            #expect(serverLog.tlsErrors.isEmpty)

            try await channel.close()
            try await awaitResult(serverLog.closed.futureResult, "the server end to close")
        }
    }

    @Test("graceful close: close_notify both ways, no unclean-shutdown error")
    func gracefulClose() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        try await withServer(try pki.serverContext()) { server in
            let message = Array("last words".utf8)
            let (channel, clientLog) = try await server.connect(try pki.clientContext(), expectedBytes: message.count)
            channel.send(message).whenComplete { _ in }
            _ = try await awaitResult(clientLog.receivedExpected.futureResult, "the echo")
            let serverLog = try await server.firstConnection()

            // The client's close sends close_notify; the server answers with its own and closes;
            // the client's close completes once the answer is in.
            try await awaitResult(channel.close(), "the client's close")
            try await awaitResult(serverLog.closed.futureResult, "the server end to close")
            try await awaitResult(clientLog.closed.futureResult, "the client end to close")

            #expect(serverLog.snapshot.closeNotifyReceived)
            #expect(clientLog.snapshot.closeNotifyReceived)
            #expect(serverLog.snapshot.errors.isEmpty)
            #expect(clientLog.snapshot.errors.isEmpty)
            #expect(serverLog.received == message)
        }
    }

    @Test("a socket closed without close_notify is reported as an unclean shutdown")
    func uncleanShutdown() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        try await withServer(try pki.serverContext()) { server in
            let (channel, clientLog) = try await server.connect(try pki.clientContext())
            _ = try await awaitResult(clientLog.handshakeCompleted.futureResult, "the client handshake")
            let serverLog = try await server.firstConnection()
            _ = try await awaitResult(serverLog.handshakeCompleted.futureResult, "the server handshake")
            // Close the socket from below the TLS handler: no close_notify is sent.
            try await channel.eventLoop.submit {
                try channel.pipeline.syncOperations.context(handlerType: TLSHandler.self).close(promise: nil)
            }.get()
            try await awaitResult(serverLog.closed.futureResult, "the server end to close")
            #expect(serverLog.tlsErrors == [.uncleanShutdown])
            #expect(!serverLog.snapshot.closeNotifyReceived)
        }
    }

    @Test("a plaintext client is refused as not TLS")
    func plaintextClient() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        // The handshake timer runs from the connection, and this test's own code may wait long for
        // a thread when the whole suite starts at once: the timeout must not win the race.
        try await withServer(try pki.serverContext(), handshakeTimeout: .minutes(10)) { server in
            let (channel, clientLog) = try await server.connectPlaintext()
            channel.send(Array("GET / HTTP/1.1\r\nHost: x\r\n\r\n".utf8)).whenComplete { _ in }
            let serverLog = try await server.firstConnection()
            try await awaitResult(serverLog.closed.futureResult, "the server end to close")
            try await awaitResult(clientLog.closed.futureResult, "the client end to close")
            #expect(serverLog.tlsErrors == [.notTLS(firstBytes: Array("GET / HT".utf8))])
            #expect(serverLog.received.isEmpty)
            #expect(serverLog.handshake == nil)
            #expect(clientLog.received.isEmpty)  // not even an alert
        }
    }

    @Test("a client certificate from another CA is refused")
    func clientFromOtherCA() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let otherCA = try CertificateAuthority.create(commonName: "Other CA", validity: 30 * day)
        let stranger = try pki.directory.write(
            try CertificateAuthority.issue(commonName: "stranger", signedBy: otherCA, validity: 30 * day),
            as: "stranger")
        let logs = try await refusedConnection(server: try pki.serverContext(), client: try pki.clientContext(stranger))
        #expect(logs.server.tlsErrors == [.peerCertificateRejected(reason: "unable to get local issuer certificate")])
        expectNothingDelivered(logs)
        expectClientSawAlert(logs.client, "tlsv1 alert unknown ca (SSL alert number 48)")
    }

    @Test("an expired client certificate is refused")
    func expiredClient() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let expired = try pki.directory.write(
            try CertificateAuthority.issue(
                commonName: "expired", signedBy: pki.ca, validity: day, notBefore: Date().addingTimeInterval(-3 * day)),
            as: "expired")
        let logs = try await refusedConnection(server: try pki.serverContext(), client: try pki.clientContext(expired))
        #expect(logs.server.tlsErrors == [.peerCertificateRejected(reason: "certificate has expired")])
        expectNothingDelivered(logs)
        expectClientSawAlert(logs.client, "sslv3 alert certificate expired (SSL alert number 45)")
    }

    @Test("a self-signed client certificate is refused")
    func selfSignedClient() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let selfSigned = try pki.directory.write(
            try CertificateAuthority.selfSigned(commonName: "lone-node", validity: 30 * day), as: "self-signed")
        let logs = try await refusedConnection(
            server: try pki.serverContext(), client: try pki.clientContext(selfSigned))
        #expect(logs.server.tlsErrors == [.peerCertificateRejected(reason: "self-signed certificate")])
        expectNothingDelivered(logs)
    }

    @Test("a client certificate that is not pinned is refused, naming its fingerprint")
    func pinMismatch() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let other = try pki.issue(commonName: "other-node", as: "other")
        let logs = try await refusedConnection(
            server: try pki.serverContext(pins: [other.fingerprint]), client: try pki.clientContext())
        #expect(logs.server.tlsErrors == [.pinMismatch(fingerprint: pki.client.fingerprint)])
        expectNothingDelivered(logs)
    }

    @Test("pinned fingerprints that match are accepted, in any spelling")
    func pinMatch() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        // Colon-separated upper case, as `openssl x509 -fingerprint -sha256` prints it.
        var colons = ""
        for (index, character) in pki.server.fingerprint.uppercased().enumerated() {
            if index > 0, index % 2 == 0 { colons.append(":") }
            colons.append(character)
        }
        try await withServer(try pki.serverContext(pins: [pki.client.fingerprint])) { server in
            let message = Array("pinned".utf8)
            let (channel, clientLog) = try await server.connect(
                try pki.clientContext(pins: [colons]), expectedBytes: message.count)
            channel.send(message).whenComplete { _ in }
            #expect(try await awaitResult(clientLog.receivedExpected.futureResult, "the echo") == message)
            try await channel.close()
        }
    }

    @Test("a server certificate from an unknown CA is refused by the client")
    func serverFromUnknownCA() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let otherCA = try CertificateAuthority.create(commonName: "Other CA", validity: 30 * day)
        let otherCAFile = try pki.directory.write(otherCA, as: "other-ca").certificate
        let logs = try await refusedConnection(
            server: try pki.serverContext(), client: try pki.clientContext(trusting: otherCAFile))
        #expect(logs.client.tlsErrors == [.peerCertificateRejected(reason: "unable to get local issuer certificate")])
        #expect(logs.client.handshake == nil)
        expectNothingDelivered(logs)
        #expect(logs.server.tlsErrors == [.peerAlert(reason: "tlsv1 alert unknown ca (SSL alert number 48)")])
    }

    @Test("a client without a certificate is refused: mutual TLS is required")
    func clientWithoutCertificate() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let anonymous = try TLSContext(
            configuration: .client(certificateChainFile: nil, privateKeyFile: nil, trustedCAFile: pki.caFile))
        let logs = try await refusedConnection(server: try pki.serverContext(), client: anonymous)
        #expect(logs.server.tlsErrors == [.peerCertificateMissing])
        expectNothingDelivered(logs)
        expectClientSawAlert(logs.client, "tlsv13 alert certificate required (SSL alert number 116)")
    }

    @Test("the client checks the server's name when told to")
    func serverName() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        try await withServer(try pki.serverContext()) { server in
            // The node certificate's subjectAltName holds its name and 127.0.0.1.
            for name in ["127.0.0.1", "node-server"] {
                let (channel, clientLog) = try await server.connect(try pki.clientContext(expectedServerName: name))
                _ = try await awaitResult(clientLog.handshakeCompleted.futureResult, "the handshake with \(name)")
                try await channel.close()
            }
        }
        let logs = try await refusedConnection(
            server: try pki.serverContext(), client: try pki.clientContext(expectedServerName: "elsewhere.example"))
        #expect(logs.client.tlsErrors == [.peerCertificateRejected(reason: "hostname mismatch")])
        expectNothingDelivered(logs)
    }

    @Test("a peer that never completes the handshake is dropped after the handshake timeout")
    func handshakeTimeout() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        try await withServer(try pki.serverContext(), handshakeTimeout: .milliseconds(200)) { server in
            let (_, clientLog) = try await server.connectPlaintext()  // connects, says nothing
            let serverLog = try await server.firstConnection()
            try await awaitResult(serverLog.closed.futureResult, "the server end to close")
            try await awaitResult(clientLog.closed.futureResult, "the client end to close")
            #expect(serverLog.tlsErrors == [.handshakeTimedOut(seconds: 0.2)])
        }
    }
}
