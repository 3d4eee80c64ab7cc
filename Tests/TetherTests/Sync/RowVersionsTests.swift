import Testing
@testable import Tether

/// The stored forms of a row's versions: uniform, explicit, and sparse when that is shorter.
@Suite struct RowVersionsTests {
    let existence = LocalVersion(timestamp: 1_000, site: 1)
    let later = LocalVersion(timestamp: 2_000, site: 3)

    @Test func oneColumnUpdatedOfNineteenIsStoredSparse() throws {
        var versions = RowVersions.uniform(existence)
        versions.setColumn(6, to: later, columnCount: 19)
        let bytes = versions.encoded()
        #expect(bytes.count == 31)
        // Form 2, the existence (timestamp, site; little-endian), 19 columns, 1 listed: column 6's.
        let existenceBytes: [UInt8] = [0xE8, 0x03, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]
        let laterBytes: [UInt8] = [0xD0, 0x07, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0]
        #expect(bytes == [2] + existenceBytes + [19, 0, 1, 0, 6, 0] + laterBytes)
        #expect(RowVersions.uniform(existence).encoded() == [0] + existenceBytes)
        let decoded = try #require(RowVersions(encoded: bytes))
        #expect(decoded == versions)
        #expect(decoded.column(6) == later && decoded.column(5) == existence && decoded.column(18) == existence)
    }

    @Test func mostColumnsUpdatedAreStoredExplicitly() throws {
        var versions = RowVersions.uniform(existence)
        for index in 0..<4 {
            versions.setColumn(index, to: LocalVersion(timestamp: 2_000 + UInt64(index), site: 3), columnCount: 4)
        }
        let bytes = versions.encoded()
        #expect(bytes.first == 1 && bytes.count == 15 + 12 * 4)
        #expect(RowVersions(encoded: bytes) == versions)
        #expect(RowVersions.uniform(existence).encoded().count == 13)
    }

    @Test func damagedSparseFormsAreRefused() {
        var versions = RowVersions.uniform(existence)
        versions.setColumn(2, to: later, columnCount: 19)
        versions.setColumn(9, to: later, columnCount: 19)
        let good = versions.encoded()
        #expect(good.count == 45 && RowVersions(encoded: good) != nil)
        var outOfRange = good
        outOfRange[31] = 19  // the second index, past the 19 columns
        #expect(RowVersions(encoded: outOfRange) == nil)
        var falling = good
        falling[31] = 1  // the second index below the first
        #expect(RowVersions(encoded: falling) == nil)
        #expect(RowVersions(encoded: Array(good.dropLast())) == nil)
        var moreListed = good
        moreListed[15] = 3
        #expect(RowVersions(encoded: moreListed) == nil)
    }
}
