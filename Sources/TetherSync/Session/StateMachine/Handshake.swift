import Tether
import TetherWire

extension SyncSessionStateMachine {
    /// Before the peer's HELLO is accepted (§8.2).
    struct HandshakingState {
        /// The peer's certificate, from the TLS handshake.
        var peer: PeerIdentity?
        /// The highest last sequence number of this database the session has been told of.
        var localLatest: Int64 = 0
    }
}

// MARK: Handshake (§8.2)

extension SyncSessionStateMachine {
    mutating func handshakeCompleted(peer: PeerIdentity) {
        guard case var .handshaking(handshake) = state else { return }
        handshake.peer = peer
        state = .handshaking(handshake)
        send(
            .hello(
                Hello(
                    instanceKey: schema.instanceKey, schemaFingerprint: schema.fingerprint,
                    capabilities: offeredCapabilities,
                    tables: schema.tables, renames: schema.renames)))
    }

    mutating func receivedHello(_ hello: Hello) {
        guard case let .handshaking(handshake) = state else { return }
        guard hello.protocolVersion == WireProtocol.version else {
            return fail(
                .protocolVersion(peerVersion: hello.protocolVersion),
                message: "this peer speaks version \(WireProtocol.version)")
        }
        // Who the peer is comes from its certificate, never from the key it declares.
        guard
            let policy = handshake.peer.map(options.peers.policy(for:))
                ?? (options.peers.acceptsOthers ? options.peers.others : nil)
        else {
            let certificate = handshake.peer.map { "its certificate \($0)" } ?? "it presented no certificate, and"
            return fail(
                .unauthorized(
                    "the \(role.peerName) was refused: \(certificate) is not among the peers this side accepts"))
        }
        guard hello.instanceKey != schema.instanceKey else {
            return fail(
                .protocolViolation("the \(role.peerName) has this database's own instance key \(hello.instanceKey)"))
        }
        let shared: SharedSchema
        switch SharedSchema.negotiate(mine: schema, theirs: hello, peerRole: role.peerName) {
        case let .success(negotiated): shared = negotiated
        case let .failure(mismatch):
            return fail(.schemaMismatch(table: mismatch.table, column: mismatch.column, message: mismatch.message))
        }
        let capabilities = offeredCapabilities.negotiated(with: hello.capabilities)
        let version3 = capabilities.contains(.version3)
        if !version3 {
            // A version 2 peer cannot hold part of a table: it knows no evictions (§8.10).
            if let table = policy.scopes.keys.min() {
                return refuseVersionTwo(
                    "this peer gives the \(role.peerName) only part of table \(table)",
                    remedy: "upgrade it, or give it whole tables")
            }
            if let table = options.interest.keys.min() {
                return refuseVersionTwo(
                    "this peer asks for only part of table \(table)", remedy: "upgrade it, or sync whole tables")
            }
        }
        let mergeRules = version3 && capabilities.contains(.mergeRules)
        if !mergeRules, let (table, column, rule) = firstSharedRule(shared) {
            // A peer that merges by no rule would take each write as the value: refused, not diverged.
            return fail(
                .schemaMismatch(
                    table: table, column: column,
                    message: """
                        table \(table): \(rule) here; the \(role.peerName) merges by no rule (upgrade it)
                        """))
        }
        var negotiated = Negotiated(
            peer: hello.instanceKey, peerIdentity: handshake.peer,
            peerPolicy: policy, shared: shared,
            live: capabilities.contains(.livePush), defers: capabilities.contains(.deferrals),
            histories: capabilities.contains(.histories), version3: version3,
            parksPulls: capabilities.contains(.livePush) && capabilities.contains(.parkedPulls),
            quietHeartbeats: capabilities.contains(.quietHeartbeats),
            pullsAhead: capabilities.contains(.pullsAhead),
            writeScope: policy.scopes.isEmpty ? nil : policy.scope(for: handshake.peer))
        negotiated.mergeRules = mergeRules
        state = .open(
            OpenState(
                negotiated: negotiated, requester: Requester(configuration),
                responder: Responder(localLatest: handshake.localLatest),
                scopes: version3 ? .awaitingPeer : .whole))
        if version3 {
            // Before any PULL: the peer answers none of this side's before knowing its interest.
            // What this side sends in part: what its policy scopes, and what it holds only part of itself.
            let heldInPart = schema.tablesHeldInPart(apartFrom: hello.instanceKey).filter(shared.sharesTable)
            send(
                .scope(
                    ScopeAnnouncement(
                        interest: options.interest, scoped: Set(policy.scopes.keys).union(heldInPart),
                        columnRules: mergeRules && !schema.ruleClaims.isEmpty ? schema.ruleClaims : nil)))
        }
        actions.append(.cancel(.hello))
        if let identity = handshake.peer {
            // First on the session's queue: no work for this peer runs unless its key is its own.
            runDatabase(.confirmPeerIdentity(peer: hello.instanceKey, certificate: identity))
        }
        scheduleHeartbeat()
        actions.append(.sessionOpened(peer: hello.instanceKey))
        summary.peer = hello.instanceKey
        if capabilities.contains(.lz4) {
            actions.append(.enableCompression)
        }
        if capabilities.contains(.columnarBatches) {
            actions.append(.enableColumnarBatches(compact: capabilities.contains(.compactColumns)))
        }
        announceLatest()
        if negotiated.peerPolicy.readOnly {
            // This side does not accept the peer's changes: it never pulls from it (§8.3).
            requester.receivedLast = true
            if configuration.byeWhenCaughtUp {
                // If the peer does not accept ours either, it never pulls: without its first PULL
                // within the idle timeout, there is nothing to do both ways (see `idleTimeout`).
                schedule(.readOnlyWait, in: options.idleTimeout)
            }
        } else {
            pull(from: hello.instanceKey)
        }
    }

    /// SCOPE (§6.12): what the peer asks to receive, and what it sends only in part. Once, before
    /// any PULL of the peer is answered.
    mutating func receivedScope(_ announcement: ScopeAnnouncement) {
        guard version3 else { return fail(.protocolViolation("SCOPE, but protocol version 3 was not negotiated")) }
        guard case .awaitingPeer = scopes else { return fail(.protocolViolation("a second SCOPE")) }
        // Without the field, the peer has no rule: each side checks the other's (§6.12).
        if mergeRules, let mismatch = ruleMismatch(announcement.columnRules ?? []) { return fail(mismatch) }
        // What the peer does not share with this side is never sent to it anyway.
        let interest = announcement.interest.filter { entry in
            schema.tables.contains { $0.name == entry.key } && shared.sharesTable(entry.key)
        }
        let sent = peerPolicy.scope(for: state.session?.negotiated.peerIdentity).intersected(with: interest)
        var received = ReceivedInPart(
            claimed: claimedInPart(announcement.scoped), asked: Set(options.interest.keys).filter(syncsTable))
        if let peer = peerKey {
            // What the peer sends this side only part of: relayed as partial to this side's other
            // peers. A table it sent in part and now sends whole stays partial here until the scope
            // backfill has brought what this side lacks of it (a session cut before then does it again).
            let recorded = Set(schema.partialTables.filter({ $0.value.contains(peer) }).keys)
            received.widened = recorded.subtracting(received.evictable).filter(syncsTable)
            let partial = received.evictable.union(received.widened)
            if partial != recorded {
                runDatabase(.recordPartialTables(peer: peer, partial))
            }
        }
        scopes = .settled(sent: sent.isPartial ? sent : nil, received: received)
    }

    /// The tables of the peer's `scoped` claim this side takes its word for (§8.10). A peer whose
    /// writes this side scopes holds a part of what this side holds, never the other way round; a
    /// read-only peer's rows never reach this side: the claims of either change nothing here (so
    /// that no peer can make this side relay a whole table as partial, or evict or refuse its rows).
    /// Of another peer, the tables both sync that its policy lets it send.
    func claimedInPart(_ scoped: Set<String>) -> Set<String> {
        guard peerPolicy.scopes.isEmpty, !peerPolicy.readOnly else { return [] }
        return scoped.filter { table in
            syncsTable(table) && peerPolicy.allowedTables.map { $0.contains(table) } != false
        }
    }

    /// A table (its row rule: no column) or a column this side shares with the peer that merges by
    /// a rule (the first, by table and column), with what it says of it: what a peer without
    /// `mergeRules` cannot sync.
    func firstSharedRule(_ shared: SharedSchema) -> (table: String, column: String?, rule: String)? {
        for (table, rule) in schema.rowRules.sorted(by: { $0.key < $1.key }) where shared.sharesTable(table) {
            return (table, nil, "its rows merge as \(rule)")
        }
        for table in schema.columnRules.keys.sorted() where shared.sharesTable(table) {
            for (column, rule) in (schema.columnRules[table] ?? [:]).sorted(by: { $0.key < $1.key })
            where shared.peerName(ofColumn: column, in: table) != nil {
                return (table, column, "column \(column) merges as a \(rule)")
            }
        }
        return nil
    }

    /// The first column both sides sync whose rules differ (ERROR 2, naming it), nil when all agree.
    func ruleMismatch(_ claims: [ColumnRuleClaim]) -> SyncSessionError? {
        var theirs: [String: [String: UInt8]] = [:]
        for claim in claims { theirs[claim.table, default: [:]][claim.column] = claim.rule }
        for table in schema.tables where shared.sharesTable(table.name) {
            let mine = schema.rowRules[table.name] ?? .deleteWins
            let code = theirs[table.name]?[""] ?? RowMergeRule.deleteWins.wireCode
            if code != mine.wireCode {
                let peerRule = RowMergeRule(wireCode: code).map { "\($0)" } ?? "row rule \(code), unknown here"
                return .schemaMismatch(
                    table: table.name, column: nil,
                    message:
                        "table \(table.name): its rows merge as \(mine) here, as \(peerRule) on the \(role.peerName)")
            }
            for column in table.valueColumns {
                guard let theirName = shared.peerName(ofColumn: column, in: table.name) else { continue }
                let mine = schema.rule(of: column, in: table.name)
                let code = theirs[table.name]?[theirName] ?? ColumnMergeRule.lastWriterWins.wireCode
                guard code != mine.wireCode else { continue }
                let peerRule = ColumnMergeRule(wireCode: code).map { "as a \($0)" } ?? "by rule \(code), unknown here"
                return .schemaMismatch(
                    table: table.name, column: column,
                    message: """
                        table \(table.name): column \(column) merges as a \(mine) here, \(peerRule) on the \
                        \(role.peerName)
                        """
                )
            }
        }
        return nil
    }

    /// Whether this side syncs `table` with the peer.
    func syncsTable(_ table: String) -> Bool {
        schema.tables.contains { $0.name == table } && shared.sharesTable(table)
    }

    /// Ends the session with a peer speaking only version 2 because of `reason`, which needs version 3
    /// (ERROR 1): a version 2 peer cannot be told which rows leave it (§8.10).
    mutating func refuseVersionTwo(_ reason: String, remedy: String) {
        fail(
            .protocolVersion(peerVersion: WireProtocol.version),
            message: """
                \(reason), which needs protocol version 3 (capability version3); the \(role.peerName) speaks \
                version 2: \(remedy)
                """)
    }

    var offeredCapabilities: Capabilities {
        var offered: Capabilities = [
            .lz4, .deferrals, .livePush, .histories, .version3, .columnarBatches, .compactColumns, .parkedPulls,
            .quietHeartbeats, .pullsAhead, .mergeRules,
        ]
        if !options.testHooks.offersMergeRules { offered.remove(.mergeRules) }
        if !options.testHooks.offersPullsAhead { offered.remove(.pullsAhead) }
        if !options.quietHeartbeats { offered.remove(.quietHeartbeats) }
        if !configuration.offersLive || !options.testHooks.offersLivePush { offered.remove(.livePush) }
        // Parking is a way of pushing: a side that does not push does not park either.
        if !offered.contains(.livePush) || !options.testHooks.offersParkedPulls { offered.remove(.parkedPulls) }
        if !options.testHooks.offersDeferrals { offered.remove(.deferrals) }
        if !options.testHooks.offersHistories { offered.remove(.histories) }
        if !options.testHooks.offersVersion3 { offered.remove(.version3) }
        if !options.testHooks.offersColumnarBatches { offered.remove(.columnarBatches) }
        if !options.testHooks.offersCompactColumns { offered.remove(.compactColumns) }
        return offered
    }
}
