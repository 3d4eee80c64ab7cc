import Foundation
import TetherBatch
@testable import TetherWire

/// A JSON value, for the vector manifest: what each valid vector decodes to.
/// 64-bit numbers are decimal strings (JSON numbers lose precision past 2^53
/// in many languages); small numbers (type indexes, codes, versions) are numbers.
indirect enum JSONValue: Codable, Equatable {
    case null
    case bool(Bool)
    case number(Int)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let value = try? container.decode(Bool.self) {
            self = .bool(value)
        } else if let value = try? container.decode(Int.self) {
            self = .number(value)
        } else if let value = try? container.decode(String.self) {
            self = .string(value)
        } else if let value = try? container.decode([JSONValue].self) {
            self = .array(value)
        } else {
            self = .object(try container.decode([String: JSONValue].self))
        }
    }

    func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .null: try container.encodeNil()
        case let .bool(value): try container.encode(value)
        case let .number(value): try container.encode(value)
        case let .string(value): try container.encode(value)
        case let .array(value): try container.encode(value)
        case let .object(value): try container.encode(value)
        }
    }
}

enum MessageJSON {
    static func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }
    static func big<T: BinaryInteger>(_ value: T) -> JSONValue { .string(String(value)) }

    static func describe(_ message: WireMessage) -> JSONValue {
        var object: [String: JSONValue] = ["type": .string(message.type.description)]
        switch message {
        case let .hello(hello):
            object["protocolVersion"] = .number(Int(hello.protocolVersion))
            object["instanceKey"] = .string(hello.instanceKey.hex)
            object["schemaFingerprint"] = .string(hex(hello.schemaFingerprint.bytes))
            object["capabilities"] = big(hello.capabilities.rawValue)
            object["tables"] = .array(hello.tables.map(describe))
            if !hello.renames.isEmpty {
                object["renames"] = .array(
                    hello.renames.map {
                        .object(["table": .string($0.table), "from": .string($0.from), "to": .string($0.to)])
                    })
            }
        case let .pull(pull):
            object["after"] = big(pull.after)
            object["resumingResync"] = .bool(pull.resumingResync)
            if pull.wholeRows { object["wholeRows"] = .bool(true) }
            if let backfill = pull.backfill {
                object["backfill"] = .object([
                    "through": big(backfill.through),
                    "tables": .array(
                        backfill.tables.map {
                            .object(["name": .string($0.name), "columns": .array($0.columns.map { .string($0) })])
                        }),
                ])
            }
            if pull.scopeBackfill { object["scopeBackfill"] = .bool(true) }
            if pull.park { object["park"] = .bool(true) }
            if pull.followOn { object["followOn"] = .bool(true) }
            if let mark = pull.history {
                object["history"] = .object(["through": big(mark.through), "clock": big(mark.clock)])
            }
            object["maxChanges"] = big(pull.maxChanges)
            object["maxBytes"] = big(pull.maxBytes)
        case let .batch(batch):
            object["batch"] = describe(batch)
        case let .ack(through):
            object["through"] = big(through)
        case let .changed(latest):
            object["latest"] = big(latest)
        case let .ping(nonce), let .pong(nonce):
            object["nonce"] = big(nonce)
        case let .error(code, message):
            object["code"] = .number(Int(code.rawValue))
            object["codeName"] = .string(String(describing: code))
            object["message"] = .string(message)
        case let .bye(reason):
            object["reason"] = .string(reason)
        case let .deferred(deferral):
            object["after"] = big(deferral.after)
            object["through"] = big(deferral.through)
            object["reason"] = .number(Int(deferral.reason.rawValue))
            object["retryAfterMilliseconds"] = big(deferral.retryAfterMilliseconds)
            object["message"] = .string(deferral.message)
        case let .history(mark):
            object["through"] = big(mark.through)
            object["clock"] = big(mark.clock)
        case let .scope(announcement):
            object["interest"] = .object(announcement.interest.mapValues(describe))
            object["scoped"] = .array(announcement.scoped.sorted().map { .string($0) })
            if let rules = announcement.columnRules {
                object["columnRules"] = .array(
                    rules.map {
                        .object([
                            "table": .string($0.table), "column": .string($0.column), "rule": .number(Int($0.rule)),
                        ])
                    })
            }
        case let .refused(refusals):
            object["changes"] = .array(
                refusals.map {
                    .object([
                        "table": .string($0.table), "key": .array($0.key.map(describe)), "sequence": big($0.sequence),
                        "reason": .string($0.reason),
                    ])
                })
        }
        return .object(object)
    }

    static func describe(_ table: TableDescriptor) -> JSONValue {
        .object([
            "name": .string(table.name), "keyColumns": .array(table.keyColumns.map { .string($0) }),
            "valueColumns": .array(table.valueColumns.map { .string($0) }),
        ])
    }

    static func describe(_ batch: ChangeBatch) -> JSONValue {
        .object([
            "source": .string(batch.source.hex), "after": big(batch.after), "through": big(batch.through),
            "isLast": .bool(batch.isLast), "isResync": .bool(batch.isResync),
            "tables": .array(batch.tables.map(describe)),
            "changes": .array(
                batch.changes.map { change in
                    var object: [String: JSONValue] = [
                        "table": .number(change.table), "sequence": big(change.sequence),
                        "isAlive": .bool(change.isAlive),
                        "existence": describe(change.existence),
                        "key": .array(change.key.map(describe)), "values": .array(change.values.map(describe)),
                    ]
                    // Absent when every value has the existence version (the uniform flag).
                    if !change.versions.isEmpty { object["versions"] = .array(change.versions.map(describe)) }
                    // Present for a partial change: which values were left out (their `values` entries are null).
                    if change.isPartial { object["omitted"] = .array(change.omitted.map { .bool($0) }) }
                    // Present for an eviction (format 2): the receiver drops the row without a tombstone.
                    if change.isEvicted { object["evicted"] = .bool(true) }
                    return .object(object)
                }),
        ])
    }

    static func describe(_ rule: ScopeRule) -> JSONValue {
        switch rule {
        case let .filter(expression): return .object(["filter": .string(expression)])
        case let .reference(column, parent, parentColumn):
            var object: [String: JSONValue] = ["reference": .string(column), "parent": .string(parent)]
            if let parentColumn { object["parentColumn"] = .string(parentColumn) }
            return .object(object)
        case let .both(first, second): return .object(["both": .array([describe(first), describe(second)])])
        }
    }

    static func describe(_ version: Version) -> JSONValue {
        .object(["timestamp": big(version.timestamp.rawValue), "origin": .string(version.origin.hex)])
    }

    static func describe(_ value: DatabaseValue) -> JSONValue {
        switch value {
        case .null: return .null
        case let .integer(v): return .object(["integer": big(v)])
        case let .real(v): return .object(["real": .string(v.isNaN ? "nan" : String(v))])
        case let .text(v): return .object(["text": .string(v)])
        case let .blob(v): return .object(["blob": .string(hex(Array(v)))])
        }
    }
}
