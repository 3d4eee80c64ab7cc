/// Splitting SQL text into statements, as SQLite reads them: semicolons inside
/// quotes, identifiers and comments do not end a statement, nor do those
/// inside a CREATE TRIGGER's BEGIN … END.
enum SQLScript {
    static func split(_ text: String) -> [String] {
        var statements: [String] = []
        var current = ""
        var meaningful = false  // saw something other than whitespace and comments
        var words: [String] = []  // the first words of the statement (for CREATE TRIGGER)
        var word = ""
        var lastWord = ""
        var characters = Array(text)[...]

        func endWord() {
            guard !word.isEmpty else { return }
            if words.count < 4 { words.append(word.uppercased()) }
            lastWord = word.uppercased()
            word = ""
        }
        func isTrigger() -> Bool {
            guard words.first == "CREATE" else { return false }
            return words.dropFirst().prefix(2).contains("TRIGGER")
        }

        while let character = characters.first {
            characters = characters.dropFirst()
            switch character {
            case "'", "\"", "`", "[":
                endWord()
                let close: Character = character == "[" ? "]" : character
                current.append(character)
                meaningful = true
                lastWord = ""
                while let next = characters.first {
                    characters = characters.dropFirst()
                    current.append(next)
                    if next == close {
                        // A doubled quote is an escaped quote, not the end.
                        if close != "]", characters.first == close {
                            current.append(close)
                            characters = characters.dropFirst()
                            continue
                        }
                        break
                    }
                }
            case "-" where characters.first == "-":
                endWord()
                current.append(character)
                while let next = characters.first, next != "\n" {
                    current.append(next)
                    characters = characters.dropFirst()
                }
            case "/" where characters.first == "*":
                endWord()
                current.append("/*")
                characters = characters.dropFirst()
                while let next = characters.first {
                    characters = characters.dropFirst()
                    current.append(next)
                    if next == "*", characters.first == "/" {
                        current.append("/")
                        characters = characters.dropFirst()
                        break
                    }
                }
            case ";":
                endWord()
                if isTrigger() && lastWord != "END" {
                    current.append(character)
                    continue
                }
                if meaningful { statements.append(current.trimmingWhitespace()) }
                current = ""
                meaningful = false
                words = []
                lastWord = ""
            default:
                if character.isLetter || character.isNumber || character == "_" || character == "$" {
                    word.append(character)
                } else {
                    endWord()
                }
                if !character.isWhitespace { meaningful = true }
                current.append(character)
            }
        }
        endWord()
        if meaningful { statements.append(current.trimmingWhitespace()) }
        return statements
    }
}

extension String {
    func trimmingWhitespace() -> String {
        var text = Substring(self)
        while text.first?.isWhitespace == true { text = text.dropFirst() }
        while text.last?.isWhitespace == true { text = text.dropLast() }
        return String(text)
    }
}
