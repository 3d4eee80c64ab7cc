import CSQLite

/// An error reported by SQLite, with everything needed to tell what went wrong
/// and where: the extended result code, SQLite's own message and the SQL that
/// failed.
///
/// ```swift
/// do {
///     try db.execute("INSERT INTO player (id) VALUES (1)")
/// } catch let error as DatabaseError where error.isConstraintViolation {
///     print(error.message)
/// }
/// ```
public struct DatabaseError: Error, Sendable, Equatable, CustomStringConvertible {
    /// SQLite's extended result code, such as `TETHER_SQLITE_CONSTRAINT_UNIQUE` (2067).
    public let extendedCode: Int32
    /// SQLite's message, or Tether's when the failure is detected before SQLite.
    public let message: String
    /// The SQL being run when the error happened, if any.
    public let sql: String?

    /// An error with SQLite's extended result code, a message, and the SQL that failed, if any;
    /// for code that reports a SQLite failure it detected itself.
    public init(extendedCode: Int32, message: String, sql: String? = nil) {
        self.extendedCode = extendedCode
        self.message = message
        self.sql = sql
    }

    /// The primary result code, such as `SQLITE_CONSTRAINT` (19).
    public var code: Int32 { extendedCode & 0xff }

    /// What kind of failure this is, for `switch`ing without magic numbers.
    public var kind: Kind {
        switch extendedCode {
        case TETHER_SQLITE_CONSTRAINT_UNIQUE, TETHER_SQLITE_CONSTRAINT_PRIMARYKEY: return .uniqueViolation
        case TETHER_SQLITE_CONSTRAINT_NOTNULL: return .notNullViolation
        case TETHER_SQLITE_CONSTRAINT_CHECK: return .checkViolation
        case TETHER_SQLITE_CONSTRAINT_FOREIGNKEY: return .foreignKeyViolation
        case TETHER_SQLITE_CONSTRAINT_DATATYPE: return .typeMismatch
        // RESTRICT actions fail through a trigger program, with this code.
        case TETHER_SQLITE_CONSTRAINT_TRIGGER where message == "FOREIGN KEY constraint failed":
            return .foreignKeyViolation
        default: break
        }
        switch code {
        case SQLITE_CONSTRAINT: return .otherConstraintViolation
        case SQLITE_BUSY, SQLITE_LOCKED: return .busy
        case SQLITE_MISUSE: return .misuse
        case SQLITE_READONLY: return .readOnly
        case SQLITE_CORRUPT, SQLITE_NOTADB: return .corrupt
        case SQLITE_CANTOPEN: return .cannotOpen
        case SQLITE_RANGE: return .argumentOutOfRange
        case SQLITE_ERROR: return .sqlError
        default: return .other
        }
    }

    /// The kinds of failure a caller handles differently, named after SQLite's result codes.
    ///
    /// ```swift
    /// catch let error as DatabaseError where error.kind == .uniqueViolation { … }
    /// ```
    public enum Kind: Sendable, Equatable {
        /// A constraint refused the write: a UNIQUE or PRIMARY KEY, NOT NULL, CHECK or FOREIGN KEY
        /// constraint (a RESTRICT action included).
        case uniqueViolation, notNullViolation, checkViolation, foreignKeyViolation
        /// Another constraint refused the write (a RAISE in a trigger, for example), or a STRICT
        /// table refused a value of the wrong type.
        case otherConstraintViolation, typeMismatch
        /// SQLite's other failures: a lock held elsewhere for longer than the busy timeout (`busy`),
        /// an API used out of order (`misuse`), a write to a read-only database (`readOnly`), a file
        /// that is damaged or not a database (`corrupt`), a file that cannot be opened (`cannotOpen`),
        /// a parameter index beyond the statement's parameters (`argumentOutOfRange`).
        case busy, misuse, readOnly, corrupt, cannotOpen, argumentOutOfRange
        /// Malformed SQL, unknown table or column, and other errors SQLite reports as SQLITE_ERROR.
        case sqlError
        /// Any other result code: read `code` and `extendedCode`.
        case other
    }

    /// Whether a constraint refused the write, whichever kind of constraint it was.
    public var isConstraintViolation: Bool { code == SQLITE_CONSTRAINT }

    /// The columns a UNIQUE (or PRIMARY KEY) violation names, without their table: SQLite
    /// reports them as "UNIQUE constraint failed: player.email, player.team". Empty for other
    /// errors, or a constraint on an expression.
    public var constrainedColumns: [String] {
        guard isConstraintViolation, let failed = message.range(of: "failed: ") else { return [] }
        return message[failed.upperBound...].split(separator: ",").compactMap { part in
            part.split(separator: ".").last.map { $0.trimmingCharacters(in: .whitespaces) }
        }
    }

    /// The disk is full (SQLITE_FULL) or failing (SQLITE_IOERR): the statement was sound, the
    /// storage could not take it. Nothing was written; the same work may succeed once there is room.
    public var isStorageFailure: Bool { code == SQLITE_FULL || code == SQLITE_IOERR }

    public var description: String {
        var text = "SQLite error \(extendedCode): \(message)"
        if let sql { text += " — while running: \(sql)" }
        return text
    }

    static func closed(sql: String? = nil) -> DatabaseError {
        DatabaseError(extendedCode: SQLITE_MISUSE, message: "the database is closed", sql: sql)
    }
}
