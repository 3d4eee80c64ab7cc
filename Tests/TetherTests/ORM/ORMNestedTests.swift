import Foundation
import Testing
@testable import Tether

// Nested models (AgileDB's DBObject properties, SundeedQLite's nested objects): a property
// that is another model, an optional model or an array of models is stored in that model's
// own table and linked by key.

struct NestEmployee: Model, Equatable {
    var id: String
    var firstName: String
    static let tableName = "nest_employee"
}

struct NestAddress: Model, Equatable {
    var id: Int64
    var city: String
    static let tableName = "nest_address"
}

@Model
struct NestEmployer: Equatable {
    var id: String
    var fullName: String?
    var headquarters: NestAddress
    var branch: NestAddress?
    var employees: [NestEmployee]
    static let tableName = "nest_employer"
}

/// A tree: nodes nest nodes.
struct NestNode: Model, Equatable {
    var id: Int64
    var name: String
    var children: [NestNode]
    static let tableName = "nest_node"
}

/// SundeedQLite's `<*>` and `<**>`, and an array that drops what is missing.
struct NestTeam: Model, Equatable {
    var id: String
    var name: String?
    var lead: NestEmployee?
    var members: [NestEmployee]
    var alumni: [NestEmployee]
    static let tableName = "nest_team"
    static var constraints: [Constraint<NestTeam>] {
        [.mandatory("name"), .mandatory("lead"), .mandatoryElements("members"), .dropsMissingElements("alumni")]
    }
}

/// A mandatory child that must itself be complete: a division whose team reads.
struct NestDivision: Model, Equatable {
    var id: String
    var team: NestTeam?
    static let tableName = "nest_division"
    static var constraints: [Constraint<NestDivision>] { [.mandatory("team")] }
}

/// The teams `fetchAll` returns, after checking that every other read of the model agrees.
private func teamsEveryReadAgreesOn(_ db: Database, sourceLocation: SourceLocation = #_sourceLocation) throws
    -> [String]
{
    let query = NestTeam.query.orderBy(\.id)
    let fetched = try db.fetchAll(query).map(\.id)
    #expect(try db.count(NestTeam.self) == fetched.count, sourceLocation: sourceLocation)
    #expect(try db.aggregate(.count, of: NestTeam.self, as: Int.self) == fetched.count, sourceLocation: sourceLocation)
    #expect(try db.fetchKeys(query) == fetched.map { PrimaryKey($0) }, sourceLocation: sourceLocation)
    let lazy = try db.lazyFetch(query)
    #expect(lazy.map { $0?.id } == fetched.map(Optional.some), sourceLocation: sourceLocation)
    #expect(try db.fetchAll(query.limit(1)).map(\.id) == Array(fetched.prefix(1)), sourceLocation: sourceLocation)
    for id in ["complete", "unnamed", "empty", "led by Sami"] {
        #expect(
            try db.exists(NestTeam.self, key: PrimaryKey(id)) == fetched.contains(id), sourceLocation: sourceLocation)
        #expect(try db.exists(NestTeam.where(\.id == id)) == fetched.contains(id), sourceLocation: sourceLocation)
        #expect(
            try (db.fetch(NestTeam.self, key: PrimaryKey(id)) != nil) == fetched.contains(id),
            sourceLocation: sourceLocation)
    }
    return fetched
}

func nestEmployer(_ id: String = "E1") -> NestEmployer {
    NestEmployer(
        id: id, fullName: "Nour Sandid", headquarters: NestAddress(id: 10, city: "Beirut"), branch: nil,
        employees: [NestEmployee(id: "e1", firstName: "Nour"), NestEmployee(id: "e2", firstName: "Sami")])
}

private func caught(_ body: () throws -> Void) -> (any Error)? {
    do { try body(); return nil } catch { return error }
}

@Suite struct ORMNestedTests {
    @Test func childrenAreRowsOfTheirOwnTablesLinkedByKey() throws {
        let db = try Database.inMemory()
        try db.createTable(NestEmployer.self)  // creates the children's tables too
        try db.insert(nestEmployer())

        #expect(try db.fetchAll(NestEmployee.self).map(\.id) == ["e1", "e2"])
        #expect(try db.fetchAll(NestAddress.self) == [NestAddress(id: 10, city: "Beirut")])
        // The parent's columns hold keys: the child's key, or a JSON array of keys.
        let row = try #require(try db.fetchRows("SELECT headquarters, branch, employees FROM nest_employer").first)
        #expect(row.values == [.integer(10), .null, .text(#"["e1","e2"]"#)])
        let columns = try db.fetchRows("SELECT name, type FROM pragma_table_info('nest_employer')").map {
            try "\($0.get(0, as: String.self)) \($0.get(1, as: String.self))"
        }
        #expect(columns == ["id TEXT", "fullName TEXT", "headquarters INTEGER", "branch INTEGER", "employees TEXT"])
        #expect(try db.fetch(NestEmployer.self, key: PrimaryKey("E1")) == nestEmployer())
    }

    @Test func aChildEditedOnItsOwnIsWhatTheParentReads() throws {
        let db = try Database.inMemory()
        try db.createTable(NestEmployer.self)
        try db.insert(nestEmployer())
        try db.update(NestEmployee(id: "e2", firstName: "Samir"))
        let employer = try #require(try db.fetch(NestEmployer.self, key: PrimaryKey("E1")))
        #expect(employer.employees.map(\.firstName) == ["Nour", "Samir"])
    }

    @Test func savingTheParentSavesItsChildrenAndASharedChildIsStoredOnce() throws {
        let db = try Database.inMemory()
        try db.createTable(NestEmployer.self)
        var second = nestEmployer("E2")
        second.branch = NestAddress(id: 10, city: "Beirut")
        try db.insert(contentsOf: [nestEmployer(), second])
        #expect(try db.count(NestAddress.self) == 1)
        #expect(try db.count(NestEmployee.self) == 2)

        second.headquarters.city = "Tripoli"  // saved with the parent, seen by both parents
        second.employees.append(NestEmployee(id: "e3", firstName: "Rana"))
        try db.save(second)
        #expect(try db.fetch(NestEmployer.self, key: PrimaryKey("E1"))?.headquarters.city == "Tripoli")
        #expect(try db.fetchAll(NestEmployer.self).map { $0.employees.count } == [2, 3])
        #expect(try db.count(NestEmployee.self) == 3)
    }

    @Test func conditionsAndAssignmentsOnANestedPropertyUseKeys() throws {
        let db = try Database.inMemory()
        try db.createTable(NestEmployer.self)
        try db.insert(nestEmployer())
        let sidon = NestAddress(id: 20, city: "Sidon")
        try db.insert(sidon)
        #expect(
            try db.fetchAll(NestEmployer.where(\.headquarters == NestAddress(id: 10, city: "Beirut"))).map(\.id) == [
                "E1"
            ])
        #expect(try db.fetchAll(NestEmployer.where(\.headquarters == sidon)).isEmpty)
        try db.update(
            NestEmployer.self, key: PrimaryKey("E1"),
            set: [.set(\.branch, to: sidon), .set(\.employees, to: [NestEmployee(id: "e1", firstName: "Nour")])])
        let row = try #require(try db.fetchRows("SELECT branch, employees FROM nest_employer").first)
        #expect(row.values == [.integer(20), .text(#"["e1"]"#)])
        #expect(try db.fetch(NestEmployer.self, key: PrimaryKey("E1"))?.branch == sidon)
    }

    @Test func deletingTheParentLeavesOrDeletesItsChildrenAsAsked() throws {
        let db = try Database.inMemory()
        try db.createTable(NestEmployer.self)
        try db.insert(contentsOf: [
            nestEmployer("E1"),
            NestEmployer(
                id: "E2", fullName: nil, headquarters: NestAddress(id: 20, city: "Sidon"),
                branch: nil, employees: [NestEmployee(id: "e9", firstName: "Lea")]),
        ])
        #expect(try db.delete(nestEmployer("E1"), deletingChildren: false))
        #expect(try db.count(NestEmployee.self) == 3)
        #expect(try db.count(NestAddress.self) == 2)

        #expect(try db.delete(NestEmployer.self, key: PrimaryKey("E2"), deletingChildren: true))
        #expect(try db.fetchAll(NestEmployee.self).map(\.id) == ["e1", "e2"])
        #expect(try db.fetchAll(NestAddress.self).map(\.id) == [10])
        #expect(try db.delete(NestEmployer.self, key: PrimaryKey("E2"), deletingChildren: true) == false)
    }

    @Test func treesSaveLoadAndDeleteRecursively() throws {
        let db = try Database.inMemory()
        try db.createTable(NestNode.self)
        let leaf = NestNode(id: 3, name: "leaf", children: [])
        let root = NestNode(
            id: 1, name: "root",
            children: [NestNode(id: 2, name: "branch", children: [leaf]), NestNode(id: 4, name: "twig", children: [])])
        try db.save(root)
        #expect(try db.count(NestNode.self) == 4)
        #expect(try db.fetch(NestNode.self, key: PrimaryKey(1)) == root)

        // A depth limit: one level of children, theirs left empty.
        let shallow = try #require(try db.fetch(NestNode.self, key: PrimaryKey(1), loading: .depth(1)))
        #expect(shallow.children.map(\.name) == ["branch", "twig"])
        #expect(shallow.children[0].children.isEmpty)
        #expect(try db.fetchAll(NestNode.where(\.id == 2), loading: .depth(0)).map(\.children) == [[]])
        // Keys only, without reading the children.
        #expect(
            try db.linkedKeys(NestNode.self, key: PrimaryKey(1), column: "children") == [PrimaryKey(2), PrimaryKey(4)])
        #expect(try db.linkedKeys(NestNode.self, key: PrimaryKey(99), column: "children") == nil)
        #expect(caught { _ = try db.linkedKeys(NestNode.self, key: PrimaryKey(1), column: "name") } is ModelError)

        try db.delete(root, deletingChildren: true)
        #expect(try db.count(NestNode.self) == 0)
    }

    @Test func aCycleIsAnErrorNotAHang() throws {
        let db = try Database.inMemory()
        try db.createTable(NestNode.self)
        let cyclic = NestNode(
            id: 1, name: "a",
            children: [NestNode(id: 2, name: "b", children: [NestNode(id: 1, name: "a again", children: [])])])
        let error = ormExpectModelError(.nestedCycle) { try db.save(cyclic) }
        #expect(
            error?.description
                == "NestNode with key 1 contains itself through its nested models: a cycle cannot be stored or loaded")
        #expect(try db.count(NestNode.self) == 0)  // nothing of it was stored

        // Links stored by other means (raw SQL, a peer) can make a cycle: reading it fails.
        try db.execute(#"INSERT INTO nest_node (id, name, children) VALUES (1, 'a', '[2]'), (2, 'b', '[1]')"#)
        ormExpectModelError(.nestedCycle) { try db.fetchAll(NestNode.self) }
        // Deleting with children visits each row once.
        #expect(try db.delete(NestNode.self, key: PrimaryKey(1), deletingChildren: true))
        #expect(try db.count(NestNode.self) == 0)
    }

    @Test func aMissingChildFailsTheFetchUnlessDeclaredOtherwise() throws {
        let db = try Database.inMemory()
        try db.createTable(NestEmployer.self)
        try db.insert(nestEmployer())
        try db.delete(NestEmployee.self, key: PrimaryKey("e2"))
        guard
            case let .missingChild(column, table, key)? = caught({ _ = try db.fetchAll(NestEmployer.self) })
                as? ModelError
        else {
            Issue.record("expected missingChild")
            return
        }
        #expect(column == "employees" && table == "nest_employee" && key == DatabaseValue.text("e2").description)
        try db.delete(NestAddress.self, key: PrimaryKey(10))
        try db.update(
            NestEmployer.self, key: PrimaryKey("E1"), set: [.set("employees", to: DatabaseValue.text(#"["e1"]"#))])
        guard
            case .missingChild(column: "headquarters", table: "nest_address", key: "10")? = caught({
                _ = try db.fetch(NestEmployer.self, key: PrimaryKey("E1"))
            }) as? ModelError
        else {
            Issue.record("expected missingChild for headquarters")
            return
        }
    }

    @Test func mandatoryChildrenAndValuesLeaveTheirParentOut() throws {
        let db = try Database.inMemory()
        try db.createTable(NestTeam.self)
        let nour = NestEmployee(id: "e1", firstName: "Nour")
        let sami = NestEmployee(id: "e2", firstName: "Sami")
        let lea = NestEmployee(id: "e3", firstName: "Lea")
        try db.insert(contentsOf: [
            NestTeam(id: "complete", name: "A", lead: nour, members: [nour, sami], alumni: [lea]),
            NestTeam(id: "unnamed", name: nil, lead: nour, members: [nour], alumni: []),
            NestTeam(id: "leaderless", name: "C", lead: nil, members: [nour], alumni: []),
            NestTeam(id: "empty", name: "D", lead: nour, members: [], alumni: []),
            NestTeam(id: "led by Sami", name: "E", lead: sami, members: [nour], alumni: []),
        ])
        #expect(try db.fetchAll(NestTeam.self).map(\.id) == ["complete", "led by Sami"])
        #expect(try db.fetch(NestTeam.self, key: PrimaryKey("unnamed")) == nil)
        #expect(try db.count(NestTeam.self) == 2)  // left out of every read, not deleted
        #expect(try db.fetchValue("SELECT count(*) FROM nest_team", as: Int.self) == 5)

        // A missing element: dropped where the array asks for it, the parent left out where mandatory.
        try db.delete(lea)
        #expect(try db.fetch(NestTeam.self, key: PrimaryKey("complete"))?.alumni == [])
        try db.delete(sami)
        #expect(try db.fetchAll(NestTeam.self).map(\.id) == [])
        #expect(try db.fetchAll(NestTeam.where(\.id == "complete")).isEmpty)
    }

    @Test func everyReadOfAModelLeavesOutTheSameIncompleteRows() throws {
        let db = try Database.inMemory()
        try db.createTable(NestDivision.self)
        let nour = NestEmployee(id: "e1", firstName: "Nour")
        let sami = NestEmployee(id: "e2", firstName: "Sami")
        let complete = NestTeam(id: "complete", name: "A", lead: nour, members: [nour, sami], alumni: [])
        try db.insert(contentsOf: [
            complete,
            NestTeam(id: "unnamed", name: nil, lead: nour, members: [nour], alumni: []),
            NestTeam(id: "empty", name: "D", lead: nour, members: [], alumni: []),
            NestTeam(id: "led by Sami", name: "E", lead: sami, members: [nour], alumni: []),
        ])
        try db.insert(NestDivision(id: "north", team: complete))
        #expect(try teamsEveryReadAgreesOn(db) == ["complete", "led by Sami"])
        #expect(try db.count(NestDivision.self) == 1)

        // A child gone: the teams that must have it are left out of every read, and so is the
        // division whose team is now incomplete.
        try db.delete(sami)
        #expect(try teamsEveryReadAgreesOn(db) == [])
        #expect(try db.fetchAll(NestDivision.self).isEmpty)
        #expect(try db.count(NestDivision.self) == 0)
        #expect(try db.fetchKeys(NestDivision.query).isEmpty)
        #expect(try db.fetchValue("SELECT count(*) FROM nest_team", as: Int.self) == 4)
    }

    @Test func declarationsThatCannotApplyAreRefused() throws {
        struct BadTeam: Model {
            var id: String
            var name: String
            static var constraints: [Constraint<BadTeam>] { [.dropsMissingElements("name")] }
        }
        struct Pair: Model {
            var a: Int64
            var b: Int64
            static var primaryKey: [ColumnRef<Pair>] { ["a", "b"] }
        }
        struct HoldsPair: Model {
            var id: Int64
            var pair: Pair
        }
        let db = try Database.inMemory()
        guard case let .invalidModel(_, reason)? = caught({ try db.createTable(BadTeam.self) }) as? ModelError else {
            Issue.record("dropsMissingElements on a text column was accepted")
            return
        }
        #expect(reason.contains("not an array of models"))
        guard case let .invalidModel(type, composite)? = caught({ try db.createTable(HoldsPair.self) }) as? ModelError
        else {
            Issue.record("a nested model with a composite key was accepted")
            return
        }
        #expect(type == "Pair" && composite.contains("composite primary key"))
    }

    @Test func aChildThatCollidesIsReportedAsTheChildsDuplicate() throws {
        struct Badge: Model, Equatable {
            var id: Int64
            var code: String
            static var constraints: [Constraint<Badge>] { [.unique("code")] }
        }
        struct Holder: Model {
            var id: Int64
            var badge: Badge
        }
        let db = try Database.inMemory()
        try db.createTable(Holder.self)
        try db.insert(Holder(id: 1, badge: Badge(id: 1, code: "A")))
        let error = ormExpectModelError(.duplicate) { try db.insert(Holder(id: 2, badge: Badge(id: 2, code: "A"))) }
        if case let .duplicate(existing, _)? = error { #expect(existing as? Badge == Badge(id: 1, code: "A")) }
        #expect(try db.count(Holder.self) == 1 && db.count(Badge.self) == 1)
    }

    @Test func aRequiredChildBelowTheDepthIsAnError() throws {
        let db = try Database.inMemory()
        try db.createTable(NestEmployer.self)
        try db.insert(nestEmployer())
        guard
            case let .invalidArgument(reason)? = caught({
                _ = try db.fetch(NestEmployer.self, key: PrimaryKey("E1"), loading: .depth(0))
            }) as? ModelError
        else {
            Issue.record("a required child was left unread without an error")
            return
        }
        #expect(reason.contains("headquarters"))
    }

    @Test func updateSchemaCreatesTheTablesOfNestedModels() throws {
        let db = try Database.inMemory()
        // A cycle (a node's children are nodes) is visited once.
        let plan = try db.updateSchema(toMatch: [NestEmployer.self, NestNode.self], dryRun: true)
        #expect(
            plan.map(\.description) == [
                "nest_employer: created", "nest_address: created", "nest_employee: created", "nest_node: created",
            ])
        #expect(
            try db.fetchValue(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name LIKE 'nest_%'", as: Int.self) == 0)

        try db.updateSchema(toMatch: [NestEmployer.self])
        let employer = NestEmployer(
            id: "e1", fullName: "Acme", headquarters: NestAddress(id: 1, city: "Oslo"), branch: nil,
            employees: [NestEmployee(id: "p1", firstName: "Ann")])
        try db.insert(employer)
        #expect(try db.fetch(NestEmployer.self, key: PrimaryKey("e1")) == employer)
        #expect(
            try db.updateSchema(toMatch: [NestEmployer.self]).map(\.description)
                == ["nest_employer: unchanged", "nest_address: unchanged", "nest_employee: unchanged"])
    }

    @Test func deletingChildrenKeepsTheChildrenOtherRowsStillLinkTo() throws {
        let db = try Database.inMemory()
        try db.createTable(NestEmployer.self)
        try db.createTable(NestTeam.self)
        // E1 and E2 share the headquarters and e1; e2 is E1's alone; a team of another model leads with e3,
        // one of E1's.
        var first = nestEmployer("E1")
        first.employees.append(NestEmployee(id: "e3", firstName: "Rami"))
        let second = NestEmployer(
            id: "E2", fullName: nil, headquarters: NestAddress(id: 10, city: "Beirut"),
            branch: NestAddress(id: 30, city: "Tyre"),
            employees: [NestEmployee(id: "e1", firstName: "Nour")])
        try db.insert(contentsOf: [first, second])
        try db.insert(
            NestTeam(
                id: "t1", name: "core", lead: NestEmployee(id: "e3", firstName: "Rami"),
                members: [NestEmployee(id: "e1", firstName: "Nour")], alumni: []))

        #expect(try db.delete(first, deletingChildren: true))
        // e2 went; e1 (E2, the team) and e3 (the team) stayed
        #expect(try db.fetchAll(NestEmployee.self).map(\.id) == ["e1", "e3"])
        #expect(try db.fetchAll(NestAddress.self).map(\.id) == [10, 30])
        #expect(try db.fetchAll(NestEmployer.self) == [second])
        #expect(try db.fetchAll(NestTeam.self).map(\.id) == ["t1"])

        // Once nothing else links to them, they go with the last parent.
        #expect(try db.delete(NestTeam.self, key: PrimaryKey("t1"), deletingChildren: true))
        #expect(try db.fetchAll(NestEmployee.self).map(\.id) == ["e1"])
        #expect(try db.delete(second, deletingChildren: true))
        #expect(try db.count(NestEmployee.self) == 0 && db.count(NestAddress.self) == 0)
    }

    @Test func aChildLinkedTwiceWithinTheDeletedGraphGoesWithIt() throws {
        let db = try Database.inMemory()
        try db.createTable(NestNode.self)
        // 2 and 3 both list 4; all of it hangs from 1.
        try db.execute(
            #"""
            INSERT INTO nest_node (id, name, children) VALUES (1, 'root', '[2,3]'), (2, 'b', '[4]'), (3, 'c', \#
            '[4]'), (4, 'shared', '[]'), (5, 'other', '[]')
            """#)
        #expect(try db.delete(NestNode.self, key: PrimaryKey(1), deletingChildren: true))
        #expect(try db.fetchRows("SELECT id FROM nest_node").map { try $0.get(0, as: Int.self) } == [5])
    }

    @Test func deletingAParentWithManyChildrenChecksThemTogether() throws {
        let db = try Database.inMemory()
        try db.createTable(NestNode.self)
        // 2,000 children in one array and one shared with another root: one query per link, not per child.
        let children = (2...2001).map { NestNode(id: Int64($0), name: "child \($0)", children: []) }
        try db.save(NestNode(id: 1, name: "root", children: children))
        try db.save(NestNode(id: 5000, name: "other root", children: [children[9]]))
        #expect(try db.delete(NestNode.self, key: PrimaryKey(1), deletingChildren: true))
        #expect(
            try db.fetchRows("SELECT id FROM nest_node ORDER BY id").map { try $0.get(0, as: Int.self) } == [11, 5000])
    }
}
