import Foundation
import TetherBatch

/// A row's key values as the scope tables store them (`tether_evictions`, `tether_refusals`): the
/// values one after the other, in the batch encoding's value format.
enum StoredRowKey {
    static func encode(_ key: [DatabaseValue]) -> Data {
        var writer = ByteWriter()
        for value in key { writer.value(value) }
        return Data(writer.bytes)
    }

    /// The values of `data`; a damaged tail is left out (what is read back is only reported).
    static func decode(_ data: Data) -> [DatabaseValue] {
        [UInt8](data).withUnsafeBytes { buffer in
            var reader = ByteReader(buffer)
            var values: [DatabaseValue] = []
            while !reader.isAtEnd, let value = try? reader.value() { values.append(value) }
            return values
        }
    }
}
