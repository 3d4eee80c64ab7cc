extension Duration {
    /// The whole milliseconds of the duration (SQLite's busy timeout, the clock's skew limit).
    var wholeMilliseconds: Int64 {
        components.seconds * 1000 + components.attoseconds / 1_000_000_000_000_000
    }
}
