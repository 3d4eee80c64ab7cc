// The earlier values of this site's own counter contributions, kept so that a restore in place
// can be undone exactly: the rekey splits each contribution at the clock of the peer's mark that
// found the restore — what it held then stays the original key's (the peers hold the original's
// later value of it), what was added since moves to the new key (Rekey.swift).

import Foundation

/// The values this site's contribution to one counter of one row held before its latest one,
/// oldest first, each as a committed write left it. Local only, never sent.
///
/// A restore point is later than every record in the restored file, among them the last time it
/// synced with any peer (`tether_peers.last_seen`): values older than that floor are dropped, all
/// but the latest of them. At most `limit` are kept; what is dropped makes the values before the
/// next one unknown (`knownSince`), which the rekey reports rather than guesses.
struct ContributionHistory: Equatable {
    struct Value: Equatable {
        var timestamp: UInt64
        var amount: CounterNumber
    }

    /// The contribution's value at a clock: none (it had none since the base), an amount, or not known.
    enum Lookup: Equatable {
        case none
        case amount(Value)
        case unknown
    }

    /// Values at clocks before this one are not known.
    var knownSince: UInt64
    var values: [Value] = []

    /// About a kilobyte: 64 transactions changing the row between two syncs.
    static let limit = 64

    /// The history of a contribution that has none stored: complete since `current` was first
    /// written, unless that was before the history was kept (`keptSince`, the clock at which the
    /// database moved to the format that keeps it).
    init(current: Value, keptSince: UInt64) {
        knownSince = current.timestamp >= keptSince ? 0 : current.timestamp
    }

    init(knownSince: UInt64, values: [Value]) {
        self.knownSince = knownSince
        self.values = values
    }

    /// Keeps `previous` (the value a new write replaces), then drops what the floor and the limit allow.
    mutating func record(_ previous: Value, floor: UInt64) {
        values.append(previous)
        var dropped = 0
        while values.count - dropped >= 2, values[dropped + 1].timestamp <= floor { dropped += 1 }
        dropped = max(dropped, values.count - Self.limit)
        guard dropped > 0 else { return }
        knownSince = max(knownSince, values[dropped].timestamp)
        values.removeFirst(dropped)
    }

    /// The contribution's value at `clock`, its latest value `current` and its state's base given:
    /// a value from before the base counts for none (the base left it out).
    func value(at clock: UInt64, current: Value, site: InstanceKey, after base: Version) -> Lookup {
        guard let latest = (values + [current]).last(where: { $0.timestamp <= clock }) else {
            return clock >= knownSince ? .none : .unknown
        }
        return Version(timestamp: HybridTimestamp(rawValue: latest.timestamp), origin: site) > base
            ? .amount(latest) : .none
    }
}

extension ContributionHistory.Value {
    init(_ contribution: CounterState.Contribution) {
        self.init(timestamp: contribution.timestamp.rawValue, amount: CounterNumber(contribution.amount) ?? .integer(0))
    }
}

extension CounterState {
    /// This state once the database's key changes from `old` to `new` after a restore found at
    /// `clock`: versions of `old` later than it were written since the restore and become `new`'s
    /// (as the rekey moves the row's versions); `old`'s contribution goes back to its value at
    /// `clock` and the difference becomes `new`'s. `exact` is false when that value was not kept
    /// (`ContributionHistory.knownSince`): all of it then moves. `stored`: the contribution's
    /// history as the row keeps it (nil: none kept, `keptSince` says since when that is complete).
    func rekeyed(
        from old: InstanceKey, to new: InstanceKey, after clock: UInt64, stored: ContributionHistory?,
        keptSince: UInt64
    ) -> (state: CounterState, exact: Bool) {
        var rekeyedBase = baseVersion
        if baseVersion.origin == old, baseVersion.timestamp.rawValue > clock {
            rekeyedBase = Version(timestamp: baseVersion.timestamp, origin: new)
        }
        var kept = contributions.filter { $0.site != old }
        var exact = true
        if let mine = contributions.first(where: { $0.site == old }) {
            if mine.timestamp.rawValue <= clock {
                kept.append(mine)
            } else {
                let current = ContributionHistory.Value(mine)
                let history = stored ?? ContributionHistory(current: current, keptSince: keptSince)
                var before: ContributionHistory.Value?
                switch history.value(at: clock, current: current, site: old, after: baseVersion) {
                case .none: before = nil
                case let .amount(value): before = value
                case .unknown: exact = false
                }
                if let before {
                    kept.append(
                        Contribution(
                            site: old, timestamp: HybridTimestamp(rawValue: before.timestamp),
                            amount: before.amount.value))
                }
                kept.append(
                    Contribution(
                        site: new, timestamp: mine.timestamp,
                        amount: (current.amount - (before?.amount ?? .integer(0))).value))
            }
        }
        return (CounterState(base: base, baseVersion: rekeyedBase, contributions: kept), exact)
    }
}

extension SyncEngine {
    /// The clock below which contribution histories keep only their latest value: the last time
    /// this database synced with any peer, less a minute for a wall clock set back (0 with no
    /// peer). Read at most once a second: an older floor keeps more, never too little.
    func contributionHistoryFloor(_ connection: Connection) throws -> UInt64 {
        let now = ContinuousClock.now
        if let cached = contributionFloorCache, now - cached.read < .seconds(1) { return cached.floor }
        let lastSeen = try connection.peerStore.lastSeenAnyPeer() ?? 0
        let milliseconds = (lastSeen - 60) * 1000
        let floor =
            milliseconds.isFinite && milliseconds > 0 && milliseconds < 0x7FFF_FFFF_FFFF
            ? HybridTimestamp(milliseconds: UInt64(milliseconds), counter: 0).rawValue : 0
        contributionFloorCache = (floor, now)
        return floor
    }
}

// MARK: Stored form

extension ContributionHistory {
    /// The byte that starts the histories after a row's counter states (`RowCounters.encoded()`):
    ///
    ///     0xB1, count (2 bytes LE), then count × (name length (2 bytes LE), name (UTF-8),
    ///         knownSince (8 bytes LE), n (2 bytes LE), n × (timestamp (8 bytes LE), amount: tag (1
    ///         INTEGER, 2 REAL), 8 bytes LE))
    static let trailerByte: UInt8 = 0xB1

    static func appendTrailer(_ histories: [(name: String, history: ContributionHistory)], to bytes: inout [UInt8]) {
        guard !histories.isEmpty else { return }
        func uint(_ value: UInt64, _ size: Int) {
            for index in 0..<size { bytes.append(UInt8(truncatingIfNeeded: value >> (8 * UInt64(index)))) }
        }
        bytes.append(trailerByte)
        uint(UInt64(histories.count), 2)
        for (name, history) in histories {
            uint(UInt64(name.utf8.count), 2)
            bytes.append(contentsOf: name.utf8)
            uint(history.knownSince, 8)
            uint(UInt64(history.values.count), 2)
            for value in history.values {
                uint(value.timestamp, 8)
                switch value.amount {
                case let .real(real): bytes.append(2); uint(real.bitPattern, 8)
                case let .integer(integer): bytes.append(1); uint(UInt64(bitPattern: integer), 8)
                case .null: bytes.append(1); uint(0, 8)
                }
            }
        }
    }

    /// The histories stored from `offset` to the end of `bytes`; nil when they are damaged.
    static func decodeTrailer(_ bytes: UnsafeRawBufferPointer, from start: Int) -> [String: ContributionHistory]? {
        var offset = start
        func uint(_ size: Int) -> UInt64? {
            guard bytes.count - offset >= size else { return nil }
            defer { offset += size }
            return (0..<size).reduce(UInt64(0)) { $0 | UInt64(bytes[offset + $1]) << (8 * UInt64($1)) }
        }
        guard uint(1) == UInt64(trailerByte), let count = uint(2) else { return nil }
        var histories: [String: ContributionHistory] = [:]
        for _ in 0..<count {
            guard let nameLength = uint(2).map(Int.init), bytes.count - offset >= nameLength else { return nil }
            let name = String(
                decoding: UnsafeRawBufferPointer(rebasing: bytes[offset..<offset + nameLength]), as: UTF8.self)
            offset += nameLength
            guard let knownSince = uint(8), let valueCount = uint(2).map(Int.init),
                valueCount <= (bytes.count - offset) / 17
            else { return nil }
            var values: [Value] = []
            values.reserveCapacity(valueCount)
            for _ in 0..<valueCount {
                guard let timestamp = uint(8), let tag = uint(1), let raw = uint(8) else { return nil }
                switch tag {
                case 1: values.append(Value(timestamp: timestamp, amount: .integer(Int64(bitPattern: raw))))
                case 2: values.append(Value(timestamp: timestamp, amount: .real(Double(bitPattern: raw))))
                default: return nil
                }
            }
            histories[name] = ContributionHistory(knownSince: knownSince, values: values)
        }
        return offset == bytes.count ? histories : nil
    }
}
