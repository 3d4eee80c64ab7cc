import Testing

@Suite("tether demo")
struct DemoTests {
    @Test("tether demo runs three TLS nodes on loopback, shows them converge and exits 0")
    func demoConverges() throws {
        let result = try tether("demo")
        #expect(result.status == 0, "\(result)")
        for line in [
            "alpha: listening on 127.0.0.1:", "gamma: listening on", "connected to beta", "All three converged",
            "merged: Stanislaw Lem, Poland",
        ] {
            #expect(result.stdout.contains(line), "missing \"\(line)\" in: \(result.stdout)")
        }
        #expect(result.stderr.isEmpty, "\(result.stderr)")
    }
}
