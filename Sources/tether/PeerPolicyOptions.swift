import ArgumentParser
import Foundation
import Tether
import TetherSync

/// The flags of `tether serve` that say which peers it accepts and what each may do. Peers are
/// named by certificate — a common name (`north`) or `sha256:FINGERPRINT` — never by instance
/// key: a peer declares its key itself, while its certificate is vouched for by the CA.
struct PeerPolicyOptions: ParsableArguments {
    static let configKeys = ["allow", "read-only-peer", "peer-policy"]

    @Option(
        help: ArgumentHelp(
            "Accept only this peer (repeatable): a certificate common name, or sha256:FINGERPRINT. "
                + "Without it, any peer the CA vouches for.", valueName: "name"))
    var allow: [String] = []

    @Option(
        name: .customLong("read-only-peer"),
        help: ArgumentHelp(
            """
            A peer (certificate name or sha256:FINGERPRINT) that may pull this node's changes but whose changes \
            are refused (repeatable).
            """,
            valueName: "name"))
    var readOnlyPeer: [String] = []

    @Option(
        name: .customLong("peer-policy"),
        help: ArgumentHelp(
            #"""
            What one peer may do, as NAME=JSON (repeatable): NAME a certificate name, sha256:FINGERPRINT or * \#
            (every other peer); JSON an object with "read-only" (true/false), "tables" (the tables it may sync) \#
            and "scopes" (per table, the rows it holds and may write: a filter "site = :peer_name", :peer_name \#
            and :peer_fingerprint from its certificate, or a reference {"reference": "order_id", "parent": \#
            "orders"}). In the configuration file: "peer-policy": {"north": {"tables": ["item"]}}.
            """#,
            valueName: "name=json"))
    var peerPolicy: [String] = []

    func validate() throws {
        _ = try policies()
    }

    /// The policies the flags give, or a `ValidationError` saying which flag is wrong and why.
    func policies() throws -> PeerPolicies {
        var rules: [PeerSelector: PeerPolicy] = [:]
        var others: PeerPolicy?
        for entry in peerPolicy {
            guard let separator = entry.firstIndex(of: "=") else {
                throw ValidationError("--peer-policy \(entry): expected NAME=JSON, e.g. north={\"read-only\":true}")
            }
            let name = String(entry[..<separator])
            let policy = try Self.policy(fromJSON: String(entry[entry.index(after: separator)...]), of: name)
            if name == "*" {
                others = policy
            } else {
                let peer = try Self.selector(name, flag: "--peer-policy")
                guard rules[peer] == nil else { throw ValidationError("--peer-policy \(name): given twice") }
                rules[peer] = policy
            }
        }
        for name in readOnlyPeer {
            let peer = try Self.selector(name, flag: "--read-only-peer")
            rules[peer, default: PeerPolicy()].readOnly = true
        }
        for name in allow {
            let peer = try Self.selector(name, flag: "--allow")
            if rules[peer] == nil { rules[peer] = PeerPolicy() }
        }
        if !allow.isEmpty, others != nil {
            throw ValidationError(
                """
                --allow accepts only the peers it names, and --peer-policy '*=…' sets what every other peer may \
                do: give one or the other
                """)
        }
        return PeerPolicies(rules, acceptsOthers: allow.isEmpty, others: others ?? PeerPolicy())
    }

    private static func selector(_ name: String, flag: String) throws -> PeerSelector {
        if InstanceKey(hex: name) != nil {
            throw ValidationError(
                "\(flag) \(name): peers are named by certificate, not by instance key "
                    + "(a peer declares its key itself). "
                    + "Give the common name of its certificate (as `tether cert node --name` made it) "
                    + "or sha256:FINGERPRINT")
        }
        guard let selector = PeerSelector(parsing: name) else {
            throw ValidationError(
                "\(flag) \(name): not a certificate name or sha256: followed by 64 hexadecimal digits")
        }
        return selector
    }

    private static func policy(fromJSON text: String, of name: String) throws -> PeerPolicy {
        guard let object = (try? JSONSerialization.jsonObject(with: Data(text.utf8))) as? [String: Any] else {
            throw ValidationError("--peer-policy \(name): \(text) is not a JSON object")
        }
        var policy = PeerPolicy()
        for (key, value) in object.sorted(by: { $0.key < $1.key }) {
            switch key {
            case "read-only":
                guard let readOnly = value as? Bool else {
                    throw ValidationError("--peer-policy \(name): \"read-only\" must be true or false")
                }
                policy.readOnly = readOnly
            case "tables":
                guard let tables = value as? [String], !tables.isEmpty else {
                    throw ValidationError("--peer-policy \(name): \"tables\" must be a non-empty array of table names")
                }
                policy.allowedTables = Set(tables)
            case "scopes":
                guard let scopes = value as? [String: Any] else {
                    throw ValidationError(
                        """
                        --peer-policy \(name): \"scopes\" must be an object of table → rule, e.g. {\"orders\": \
                        \"site = :peer_name\"}
                        """)
                }
                for (table, rule) in scopes.sorted(by: { $0.key < $1.key }) {
                    policy.scopes[table] = try ScopeRuleText.rule(
                        fromJSON: rule, context: "--peer-policy \(name): scope of \(table)")
                }
            default:
                throw ValidationError(
                    "--peer-policy \(name): unknown key \"\(key)\" (known: \"read-only\", \"tables\", \"scopes\")")
            }
        }
        return policy
    }
}
