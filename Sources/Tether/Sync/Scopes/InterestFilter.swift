import CSQLite

// A peer's filter (its interest, SCOPE §6.12) is text from the network that this node evaluates
// in its own queries. It is checked here, and only here, before it is compiled (see
// `SyncEngine.compile`): the operator's own rules (`SyncScope.tables`) are trusted as written.

extension SyncScope {
    /// The functions a peer's filter (an interest) may call: deterministic scalar functions whose
    /// result is no larger than their arguments (no `randomblob`, `zeroblob`, `replace`, `printf`,
    /// `load_extension`, no date function reading the clock). `LIKE` and `GLOB` are the functions
    /// `like` and `glob`. Protocol/README.md §8.10 lists the same.
    public static let interestFunctions: Set<String> = [
        "abs", "coalesce", "glob", "if", "ifnull", "iif", "instr", "length", "like", "likelihood", "likely", "lower",
        "ltrim", "max", "min", "nullif", "octet_length", "round", "rtrim", "sign", "substr", "substring", "trim",
        "typeof", "unicode", "unlikely", "upper",
    ]
}

/// The checks of a peer's filter beyond those of every filter (`SyncEngine.checkFilter`): its text
/// is one expression that cannot escape the parentheses it is pasted in, and what SQLite's
/// authorizer reports while it is prepared reads only its own table's row and calls only
/// `SyncScope.interestFunctions`.
enum InterestFilter {
    /// Lexes `expression` with SQLite's quoting rules: strings `'…'` (`''` inside), identifiers
    /// `"…"`, `` `…` `` (doubled inside) and `[…]`; outside them, parentheses must balance without
    /// ever closing more than were opened, and there may be no `;`, no comment (`--`, `/*`) and no
    /// control character but white space. Throws `.notOneExpression` naming `table`, saying what is at
    /// which offset.
    static func checkText(_ expression: String, of table: String) throws(ScopeError) {
        func refuse(_ found: String) -> ScopeError { ScopeError(table: table, reason: .notOneExpression(found)) }
        let bytes = Array(expression.utf8)
        var depth = 0
        var index = 0
        while index < bytes.count {
            let byte = bytes[index]
            switch byte {
            case UInt8(ascii: "'"), UInt8(ascii: "\""), UInt8(ascii: "`"), UInt8(ascii: "["):
                let closing = byte == UInt8(ascii: "[") ? UInt8(ascii: "]") : byte
                var end = index + 1
                while true {
                    guard end < bytes.count else {
                        throw refuse("the quote \(Character(Unicode.Scalar(byte))) at offset \(index) is never closed")
                    }
                    if bytes[end] == 0 { throw refuse("a NUL character at offset \(end)") }
                    if bytes[end] == closing {
                        // A doubled quote stands for itself (not inside […], which has no escape).
                        if closing != UInt8(ascii: "]"), end + 1 < bytes.count, bytes[end + 1] == closing {
                            end += 2
                            continue
                        }
                        break
                    }
                    end += 1
                }
                index = end
            case UInt8(ascii: "("):
                depth += 1
            case UInt8(ascii: ")"):
                depth -= 1
                if depth < 0 { throw refuse("the ) at offset \(index) closes a parenthesis the interest did not open") }
            case UInt8(ascii: ";"):
                throw refuse("a ; at offset \(index)")
            case UInt8(ascii: "-") where index + 1 < bytes.count && bytes[index + 1] == UInt8(ascii: "-"),
                UInt8(ascii: "/") where index + 1 < bytes.count && bytes[index + 1] == UInt8(ascii: "*"):
                throw refuse("a comment at offset \(index)")
            case UInt8(ascii: " "), UInt8(ascii: "\t"), UInt8(ascii: "\n"), UInt8(ascii: "\r"), 0x0C:
                break
            case 0..<0x20, 0x7F:
                throw refuse("the control character \(byte) at offset \(index)")
            default:
                break
            }
            index += 1
        }
        if depth > 0 { throw refuse("\(depth) parenthesis(es) opened and never closed") }
    }

    /// Judges what SQLite's authorizer reported while `SELECT (<filter>) FROM <table>` was
    /// prepared: the one SELECT, reads of `table`'s columns, and calls of allowed functions; a
    /// second SELECT (a subquery, a WITH), a recursive WITH or a read of another table reads
    /// other rows, and anything else is not an expression's work.
    static func judge(_ actions: [AuthorizedAction], of table: String) throws(ScopeError) {
        func refuse(_ reason: ScopeError.Reason) -> ScopeError { ScopeError(table: table, reason: reason) }
        // Reading other rows is the graver fault: named before any function the subquery calls.
        var selects = 0
        for action in actions {
            switch action.code {
            case SQLITE_SELECT:
                selects += 1
                if selects > 1 { throw refuse(.interestReadsOtherRows) }
            case SQLITE_READ where action.first?.lowercased() != table.lowercased():
                throw refuse(.interestReadsOtherRows)
            case SQLITE_RECURSIVE:
                throw refuse(.interestReadsOtherRows)
            default:
                break
            }
        }
        for action in actions {
            switch action.code {
            case SQLITE_SELECT, SQLITE_READ:
                break
            case SQLITE_FUNCTION:
                let function = action.second?.lowercased() ?? ""
                guard SyncScope.interestFunctions.contains(function) else {
                    throw refuse(.functionNotAllowed(function))
                }
            default:
                throw refuse(
                    .notOneExpression("it does more than compute a value (SQLite authorizer action \(action.code))"))
            }
        }
    }
}
