import Testing

extension Trait where Self == TimeLimitTrait {
    /// How long a test that waits for events may run before it counts as hung. Wall-clock time from
    /// the test's start: in the full suite, heavy synchronous tests (the convergence shards) can
    /// hold both of a 2-core machine's cooperative threads for over a minute, and an awaiting test
    /// is not resumed meanwhile (ten observation tests once failed a one-minute limit that way), so
    /// the limit is well above that, still far below CI's.
    public static var hangLimit: Self { .timeLimit(.minutes(10)) }
}
