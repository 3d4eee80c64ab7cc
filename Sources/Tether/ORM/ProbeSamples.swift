import Foundation

/// Where the schema probe gets the values it decodes a model with (see
/// `SchemaProbe`). A value only has to be a valid instance of its type: the
/// column's storage class comes from the type (`DatabaseValueConvertible.columnType`),
/// never from which value was found, and the value is never stored.
///
/// The sources, in order, each asked only if the ones before gave nothing:
/// the type's own `sampleValues`; the cases of a `CaseIterable` type; the cases
/// of an enum without associated values, read from its type metadata (so
/// `enum Color: String, Codable, DatabaseValueConvertible { case red, green }`
/// needs nothing more); a stored value the type's `fromDatabaseValue` accepts
/// (how the built-in types are sampled); the type decoded through its own
/// `init(from:)` from placeholder values (a struct with a synthesized `Codable`).
enum ProbeSamples {
    /// Up to two different values of `T` (one when it has a single value), or
    /// an empty array when no source gives one. `decodable` is the last source.
    static func values<T>(_ type: T.Type, decodable: () -> [T]) -> [T] {
        if let convertible = T.self as? any DatabaseValueConvertible.Type,
            let samples = declaredSamples(convertible) as? [T], !samples.isEmpty
        {
            return Array(samples.prefix(2))
        }
        if let iterable = T.self as? any CaseIterable.Type, let cases = firstCases(iterable) as? [T] {
            return cases
        }
        if let cases = EnumCases.firstCases(T.self, limit: 2), !cases.isEmpty { return cases }
        if let convertible = T.self as? any DatabaseValueConvertible.Type,
            let accepted = acceptedStoredValues(convertible) as? [T], !accepted.isEmpty
        {
            return accepted
        }
        return decodable()
    }

    private static func declaredSamples<V: DatabaseValueConvertible>(_ type: V.Type) -> [V] { V.sampleValues }

    private static func firstCases<C: CaseIterable>(_ type: C.Type) -> [C] { Array(C.allCases.prefix(2)) }

    /// Values `V.fromDatabaseValue` makes from a few stored values of its
    /// storage class: the first, and the first one that stores differently.
    private static func acceptedStoredValues<V: DatabaseValueConvertible>(_ type: V.Type) -> [V] {
        let candidates: [DatabaseValue]
        switch V.columnType {
        case .integer: candidates = [.integer(0), .integer(1), .integer(2)]
        case .real: candidates = [.real(0), .real(1)]
        case .text, .json:
            candidates = [
                .text("0"), .text("1"), .text("a"), .text("b"), .text(""),
                .text("00000000-0000-0000-0000-000000000000"), .text("00000000-0000-0000-0000-000000000001"),
            ]
        case .blob:
            candidates = [.blob(Data()), .blob(Data([1])), .blob(Data(count: 16)), .blob(Data(count: 15) + [1])]
        }
        let decoded = candidates.lazy.compactMap { V.fromDatabaseValue($0) }
        guard let first = decoded.first else { return [] }
        guard let second = decoded.first(where: { $0.databaseValue != first.databaseValue }) else { return [first] }
        return [first, second]
    }
}

/// The cases of an enum without associated values, made from the type alone.
///
/// Such an enum is stored as its case number, counting from 0 in declaration
/// order, in the fewest bytes that hold them all (none for a single case): the
/// Swift ABI's layout of enums without payloads (docs/ABI/TypeLayout.rst).
/// The number of cases comes from the enum's nominal type descriptor, as the
/// runtime records it; an enum with a payload case, or any other type, gives nil.
enum EnumCases {
    /// Metadata kind of a Swift enum (`MetadataKind::Enum`); `Optional` has its own kind.
    private static let enumKind: UInt = 0x201

    static func firstCases<T>(_ type: T.Type, limit: Int) -> [T]? {
        guard let count = caseCount(of: T.self), _isPOD(T.self) else { return nil }
        let size = MemoryLayout<T>.size
        // The case numbers must fit the storage: at most 4 bytes is far beyond any real enum.
        guard size <= 4, count <= (size == 0 ? 1 : 1 << (8 * size)) else { return nil }
        return (0..<min(count, limit)).map { number in
            withUnsafeTemporaryAllocation(byteCount: max(size, 1), alignment: MemoryLayout<T>.alignment) { buffer in
                // Little-endian, like every platform Swift on Linux runs on.
                for index in 0..<size { buffer[index] = UInt8(truncatingIfNeeded: number >> (8 * index)) }
                return buffer.load(as: T.self)
            }
        }
    }

    /// How many cases `type` has, when it is an enum none of whose cases has a payload.
    private static func caseCount(of type: Any.Type) -> Int? {
        let metadata = unsafeBitCast(type, to: UnsafeRawPointer.self)
        guard metadata.load(as: UInt.self) == enumKind else { return nil }
        // Enum metadata: kind, then the nominal type descriptor.
        guard let descriptor = metadata.load(fromByteOffset: MemoryLayout<UInt>.size, as: UnsafeRawPointer?.self) else {
            return nil
        }
        // TargetEnumDescriptor: flags, parent, name, access function, fields (5 × 4 bytes),
        // then the payload case count (low 24 bits) and the count of cases without payload.
        let payloadCases = descriptor.load(fromByteOffset: 20, as: UInt32.self) & 0x00FF_FFFF
        let emptyCases = descriptor.load(fromByteOffset: 24, as: UInt32.self)
        guard payloadCases == 0, emptyCases > 0 else { return nil }
        return Int(emptyCases)
    }
}
