/// Values by column name for the few columns of one row (its counter states), sorted by name and
/// found by a linear search: no hashing and one small buffer, where a dictionary hashed the name
/// on every read and write of a row's counters (each local increment's stamp, each apply).
struct ColumnKeyed<Value> {
    /// Ascending by name, each name once.
    private(set) var entries: [(key: String, value: Value)] = []

    var isEmpty: Bool { entries.isEmpty }
    var count: Int { entries.count }

    init(_ values: [String: Value]) {
        entries = values.sorted { $0.key < $1.key }.map { (key: $0.key, value: $0.value) }
    }

    subscript(name: String) -> Value? {
        get {
            for entry in entries where entry.key == name { return entry.value }
            return nil
        }
        set {
            // The place of `name`: its entry, or where it goes to keep the order.
            var index = 0
            while index < entries.count, entries[index].key < name { index += 1 }
            let found = index < entries.count && entries[index].key == name
            switch (newValue, found) {
            case let (value?, true): entries[index].value = value
            case let (value?, false): entries.insert((key: name, value: value), at: index)
            case (nil, true): entries.remove(at: index)
            case (nil, false): break
            }
        }
    }
}

extension ColumnKeyed: Sequence {
    func makeIterator() -> IndexingIterator<[(key: String, value: Value)]> { entries.makeIterator() }
}

extension ColumnKeyed: ExpressibleByDictionaryLiteral {
    init(dictionaryLiteral elements: (String, Value)...) {
        for (name, value) in elements { self[name] = value }
    }
}

extension ColumnKeyed: Equatable where Value: Equatable {
    static func == (lhs: ColumnKeyed, rhs: ColumnKeyed) -> Bool {
        lhs.entries.count == rhs.entries.count
            && zip(lhs.entries, rhs.entries).allSatisfy { $0.key == $1.key && $0.value == $1.value }
    }
}
