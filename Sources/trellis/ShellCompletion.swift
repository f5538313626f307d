import Foundation
import Trellis
import TrellisCore

/// Tab completion in `trellis shell`: the first word completes to a command, the second to a
/// collection for the commands taking one, and later words to the field paths found in a sample
/// of that collection's documents.
extension Shell {
    /// Every command `help` lists (and `exit`), in byte order.
    static let commandNames = [
        "clear", "collections", "count", "discovered", "distrust", "evict", "exit", "find", "get", "help", "index",
        "next", "next-id", "observe", "observe-id", "observe-next", "observe-next-id", "peers", "presence",
        "promote-key", "quit", "remove", "rules", "status", "subscribe", "subscribe-id", "subscriptions", "sync",
        "trust", "unobserve", "unobserve-id", "unsubscribe", "unsubscribe-id", "update", "upsert",
    ]

    /// The commands whose first argument is a COLLECTION.
    static let collectionCommands: Set<String> = [
        "upsert", "get", "update", "find", "count", "remove", "evict", "index", "subscribe", "unsubscribe",
        "subscribe-id", "unsubscribe-id", "observe", "observe-next", "next", "unobserve", "observe-id",
        "observe-next-id", "next-id", "unobserve-id",
    ]

    /// The commands taking a QUERY, SELECT, PATH or mutations after the collection.
    static let pathCommands: Set<String> = [
        "update", "find", "count", "remove", "evict", "index", "subscribe", "unsubscribe", "observe", "observe-next",
        "next", "unobserve",
    ]

    /// How many documents of a collection are read to find its field paths.
    static let pathSampleSize = 100
    /// How long the collections' names and a collection's field paths are reused.
    static let completionCacheLifetime = Duration.seconds(5)

    /// The words before the cursor, the index of the word being completed, and that word so far
    /// (empty after a space or tab).
    static func wordAtCursor(_ text: String) -> (words: [String], index: Int, word: String) {
        let words = text.split(whereSeparator: { $0 == " " || $0 == "\t" }).map(String.init)
        let endsWord = text.last.map { $0 == " " || $0 == "\t" } ?? true
        let index = endsWord ? words.count : words.count - 1
        return (words, index, endsWord ? "" : words[index])
    }

    /// The names starting with `word`, byte for byte.
    static func matching(_ names: [String], _ word: String) -> [String] {
        names.filter { $0.utf8.starts(with: word.utf8) }
    }

    /// What Tab completes without a store (`trellis attach`): command names only.
    static func commandCompletion(before text: String) -> LineEditor.Completion {
        let (_, index, word) = wordAtCursor(text)
        guard index == 0 else { return .init(word: "", candidates: [], appendsSpace: false) }
        return .init(word: word, candidates: matching(commandNames, word), appendsSpace: true)
    }

    /// What Tab may insert, given the text before the cursor (see ``LineEditor/Completion``).
    /// Candidates start with the word typed byte for byte.
    func completion(before text: String) -> LineEditor.Completion {
        let (words, index, word) = Self.wordAtCursor(text)
        let matching = Self.matching
        switch index {
        case 0:
            return Self.commandCompletion(before: text)
        case 1 where Self.collectionCommands.contains(words[0]):
            return .init(word: word, candidates: matching(collectionNames(), word), appendsSpace: true)
        case 2... where Self.pathCommands.contains(words[0]):
            // A path may follow an operator or a parenthesis without a space: `(hp>3&&sp`.
            let start = word.unicodeScalars.lastIndex(where: { "(!=<>,&|".unicodeScalars.contains($0) })
            let path = start.map { String(word.unicodeScalars[word.unicodeScalars.index(after: $0)...]) } ?? word
            return .init(word: path, candidates: matching(fieldPaths(of: words[1]), path), appendsSpace: false)
        default:
            return .init(word: word, candidates: [], appendsSpace: false)
        }
    }

    /// The collections' names (those holding documents), cached for a few seconds.
    func collectionNames() -> [String] {
        if let cached = collectionCache, ContinuousClock.now - cached.at < Self.completionCacheLifetime {
            return cached.names
        }
        let names = ((try? node.store.documents.collectionCounts()) ?? []).map(\.0)
        collectionCache = (names, .now)
        return names
    }

    /// The field paths of the first ``pathSampleSize`` documents of `collection`, top-level and
    /// nested in maps (`specs.hp`; a key that is not a plain name is quoted: `` `odd key` ``),
    /// in byte order, cached for a few seconds. Array elements are not entered.
    func fieldPaths(of collection: String) -> [String] {
        if let cached = pathCache[collection], ContinuousClock.now - cached.at < Self.completionCacheLifetime {
            return cached.paths
        }
        let documents =
            (try? node.store.collection(collection).find("true").limit(Self.pathSampleSize).exec()) ?? []
        var paths = Set<String>()
        for document in documents { Self.collectPaths(document.value, prefix: "", depth: 0, into: &paths) }
        let sorted = paths.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
        if pathCache.count > 64 { pathCache.removeAll() }
        pathCache[collection] = (sorted, .now)
        return sorted
    }

    /// Adds the paths of `value`'s map keys (and of maps inside them, 16 levels at most) to
    /// `paths`, which holds at most 2,000.
    static func collectPaths(_ value: Value, prefix: String, depth: Int, into paths: inout Set<String>) {
        guard case .map(let map) = value, depth < 16 else { return }
        for (key, child) in zip(map.keys, map.values) where paths.count < 2_000 {
            let name = plainName(key) ? key : "`" + key.replacing("\\", with: "\\\\").replacing("`", with: "\\`") + "`"
            let path = prefix.isEmpty ? name : prefix + "." + name
            paths.insert(path)
            collectPaths(child, prefix: path, depth: depth + 1, into: &paths)
        }
    }

    /// Whether `key` can be written bare in a field path: a letter, `_` or `$`, then also digits.
    static func plainName(_ key: String) -> Bool {
        guard let first = key.utf8.first else { return false }
        func start(_ c: UInt8) -> Bool { (c >= 65 && c <= 90) || (c >= 97 && c <= 122) || c == 95 || c == 36 }
        return start(first) && key.utf8.allSatisfy { start($0) || ($0 >= 48 && $0 <= 57) }
    }
}
