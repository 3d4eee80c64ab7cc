import Foundation
import Testing

@testable import Tether
import TetherTestSupport

/// Tables whose row rule is add-wins: an update the deleting peer had not seen brings the row back.
@Suite struct AddWinsRowTests {
    static let schema = "CREATE TABLE cart (item TEXT PRIMARY KEY, quantity INTEGER, note TEXT)"

    static func node(_ rule: RowMergeRule = .addWins) throws -> Database {
        let db = try Database.inMemory()
        try db.execute(schema)
        try db.enableSync(table: "cart", rowRule: rule)
        return db
    }

    static func rows(_ db: Database) throws -> [String] {
        try db.fetchRows("SELECT item, quantity, note FROM cart ORDER BY item").map {
            $0.values.map(\.description).joined(separator: "|")
        }
    }

    /// A empties the cart while B, which had not seen that, changes an item: the item comes back
    /// on both, with B's change (in both orders of delivery). The other item, which nobody
    /// changed, stays deleted.
    @Test func anUpdateTheDeleteDidNotSeeBringsTheRowBack() throws {
        for aFirst in [true, false] {
            let a = try Self.node(), b = try Self.node()
            try a.execute("INSERT INTO cart VALUES ('tea', 1, 'green'), ('milk', 2, NULL)")
            try sendChanges(from: a, to: b)
            try a.execute("DELETE FROM cart")
            try b.execute("UPDATE cart SET quantity = 3 WHERE item = 'tea'")
            if aFirst {
                try sendChanges(from: a, to: b)
                try sendChanges(from: b, to: a)
            } else {
                try sendChanges(from: b, to: a)
                try sendChanges(from: a, to: b)
            }
            try CounterColumnTests.exchange(a, b)
            #expect(try Self.rows(a) == ["'tea'|3|'green'"], "a first: \(aFirst)")
            #expect(try Self.rows(b) == ["'tea'|3|'green'"], "a first: \(aFirst)")
        }
    }

    /// Add-wins rows with a counter: A's sale reached B, then A deleted the row while B, not
    /// having seen that, sold again. The row comes back on every peer as B holds it — its value
    /// the sum of both sales — in any order of delivery, also through a relay.
    @Test func aRowBroughtBackKeepsItsCounterContributions() throws {
        for order in [[(0, 1), (1, 0)], [(1, 0), (0, 1)], [(1, 2), (0, 2), (2, 0), (2, 1)]] {
            let nodes = try (0..<3).map { _ in
                let db = try Database.inMemory()
                try db.execute(Self.schema)
                try db.enableSync(table: "cart", columnRules: ["quantity": .counter], rowRule: .addWins)
                return db
            }
            let (a, b) = (nodes[0], nodes[1])
            try a.execute("INSERT INTO cart VALUES ('tea', 1, 'green')")
            try sendChanges(from: a, to: b)
            try a.execute("UPDATE cart SET quantity = quantity + 5")
            try sendChanges(from: a, to: b)
            try a.execute("DELETE FROM cart")
            try b.execute("UPDATE cart SET quantity = quantity + 2")
            try CounterColumnTests.deliver(among: nodes, first: order)
            for (index, node) in nodes.enumerated() {
                #expect(try Self.rows(node) == ["'tea'|8|'green'"], "node \(index), order \(order)")
            }
        }
    }

    /// The default: the delete wins over the same update.
    @Test func withDeleteWinsTheRowStaysDeleted() throws {
        let a = try Self.node(.deleteWins), b = try Self.node(.deleteWins)
        try a.execute("INSERT INTO cart VALUES ('tea', 1, 'green')")
        try sendChanges(from: a, to: b)
        try a.execute("DELETE FROM cart")
        try b.execute("UPDATE cart SET quantity = 3")
        try CounterColumnTests.exchange(a, b)
        #expect(try Self.rows(a) == [])
        #expect(try Self.rows(b) == [])
    }

    /// A delete made after seeing every update still deletes, on every peer (and through a relay).
    @Test func aDeleteThatSawTheUpdateDeletes() throws {
        let a = try Self.node(), b = try Self.node(), c = try Self.node()
        try a.execute("INSERT INTO cart VALUES ('tea', 1, 'green')")
        try sendChanges(from: a, to: b)
        try sendChanges(from: a, to: c)
        try b.execute("UPDATE cart SET quantity = 3")
        try sendChanges(from: b, to: a)
        try a.execute("DELETE FROM cart")
        try sendChanges(from: a, to: c)  // c: the delete before the update it saw
        try sendChanges(from: b, to: c)
        try CounterColumnTests.exchange(a, b)
        try CounterColumnTests.exchange(b, c)
        for db in [a, b, c] { #expect(try Self.rows(db) == []) }
    }

    /// Three peers: a deletes, b and c update different columns unseen; every peer ends with the
    /// row back holding both updates, in several orders of delivery.
    @Test func concurrentUpdatesOnTwoPeersBothSurviveTheDelete() throws {
        let orders: [[(Int, Int)]] = [[(0, 1), (2, 1), (1, 0), (1, 2)], [(2, 0), (1, 0), (0, 1), (0, 2)]]
        for order in orders {
            let nodes = try (0..<3).map { _ in try Self.node() }
            try nodes[0].execute("INSERT INTO cart VALUES ('tea', 1, 'green')")
            for to in 1..<3 { try sendChanges(from: nodes[0], to: nodes[to]) }
            try nodes[0].execute("DELETE FROM cart")
            try nodes[1].execute("UPDATE cart SET quantity = 5")
            try nodes[2].execute("UPDATE cart SET note = 'black'")
            try CounterColumnTests.deliver(among: nodes, first: order)
            for node in nodes { #expect(try Self.rows(node) == ["'tea'|5|'black'"]) }
        }
    }

    /// The rule is recorded with the table and read back.
    @Test func theRuleIsRecorded() throws {
        let db = try Self.node()
        #expect(try db.syncedTableRecords().first { $0.name == "cart" }?.rowRule == .addWins)
        try db.enableSync(table: "cart")
        #expect(try db.syncedTableRecords().first { $0.name == "cart" }?.rowRule == .deleteWins)
    }
}
