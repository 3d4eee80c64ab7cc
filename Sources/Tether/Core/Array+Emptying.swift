extension Array {
    /// Removes every element and keeps the buffer, element by element: for the one or two elements
    /// a statement's capture holds, several times cheaper than `removeAll(keepingCapacity:)`, whose
    /// general range replacement runs per statement on the write path.
    mutating func empty() {
        while popLast() != nil {}
    }
}
