import Foundation
import Trellis
import TrellisStore

/// Parsing of the shell's arguments: IDs, write strategies, mutations and the trailing
/// `sort` / `limit` / `offset` modifiers of `find` and `count`.
enum ShellSyntax {
    /// A chunk of text between spaces; quotes (`'`, `"`, backticks, with backslash escapes) and
    /// JSON brackets group, so a chunk may hold spaces.
    struct Chunk {
        var text: Substring
        var range: Range<String.Index>
    }

    /// Splits text into chunks.
    ///
    /// Scanning goes by Unicode scalar, not by `Character`: a quote, bracket or space followed by
    /// a combining mark (`"\u{301}"`) still quotes, brackets or separates, so names are taken
    /// byte for byte.
    ///
    /// - Throws: ``UsageError`` for an unclosed quote or bracket.
    static func chunks(_ text: Substring) throws -> [Chunk] {
        var out: [Chunk] = []
        let scalars = text.unicodeScalars
        var i = scalars.startIndex
        while i < scalars.endIndex {
            if scalars[i].properties.isWhitespace {
                i = scalars.index(after: i)
                continue
            }
            let start = i
            var depth = 0
            while i < scalars.endIndex, depth > 0 || !scalars[i].properties.isWhitespace {
                let c = scalars[i]
                if c == "'" || c == "\"" || c == "`" {
                    i = try skipQuoted(text, from: i)
                    continue
                }
                if c == "{" || c == "[" { depth += 1 }
                if c == "}" || c == "]" { depth = max(0, depth - 1) }
                i = scalars.index(after: i)
            }
            if depth > 0 { throw UsageError("unclosed bracket in '\(text[start...])'") }
            out.append(Chunk(text: text[start..<i], range: start..<i))
        }
        return out
    }

    /// The index after the quoted run starting at `start` (whose scalar is the quote).
    static func skipQuoted(_ text: Substring, from start: String.Index) throws -> String.Index {
        let scalars = text.unicodeScalars
        let quote = scalars[start]
        var i = scalars.index(after: start)
        while i < scalars.endIndex {
            if scalars[i] == "\\" {
                i = scalars.index(after: i)
                if i < scalars.endIndex { i = scalars.index(after: i) }
                continue
            }
            if scalars[i] == quote { return scalars.index(after: i) }
            i = scalars.index(after: i)
        }
        throw UsageError("unclosed \(quote) in '\(text[start...])'")
    }

    /// Splits on `;` outside quotes (scanning by Unicode scalar, as ``chunks(_:)``).
    static func splitStatements(_ text: Substring) throws -> [Substring] {
        var parts: [Substring] = []
        let scalars = text.unicodeScalars
        var start = scalars.startIndex
        var i = scalars.startIndex
        while i < scalars.endIndex {
            let c = scalars[i]
            if c == "'" || c == "\"" || c == "`" {
                i = try skipQuoted(text, from: i)
                continue
            }
            if c == ";" {
                parts.append(text[start..<i])
                start = scalars.index(after: i)
            }
            i = scalars.index(after: i)
        }
        parts.append(text[start...])
        return parts
    }

    /// Characters a bare (unquoted) ID may not hold: those of query operators and quotes, so
    /// that a query given where an ID is expected is refused rather than taken as an ID.
    static let notInBareID = Set("=<>!&|()'`".unicodeScalars)

    /// An `_id`: JSON when it starts with `{` or `"`, otherwise one word taken as a string.
    ///
    /// - Parameter query: how the command selects by query instead (`remove c where QUERY`), named
    ///   in the error when the text looks like a query.
    /// - Throws: ``UsageError`` for nothing, more than one word, or a word holding a query
    ///   operator or a quote (write such an ID as JSON: `"a b"`).
    static func id(_ text: Substring, query: String? = nil) throws -> Value {
        let t = text.trimmingCharacters(in: .whitespaces)
        guard !t.isEmpty else { throw UsageError("missing ID") }
        let words = try chunks(Substring(t))
        // By byte: `{` or `"` followed by a combining mark still starts JSON.
        let json = t.utf8.first == UInt8(ascii: "{") || t.utf8.first == UInt8(ascii: "\"")
        if json && words.count == 1 { return try JSON.parse(t) }
        guard words.count > 1 || t.unicodeScalars.contains(where: notInBareID.contains) else { return .string(t) }
        let looksLikeQuery = (try? Query(t)) != nil || t.unicodeScalars.contains(where: notInBareID.contains)
        var message = "'\(t)' is not an ID"
        message += looksLikeQuery ? ": it looks like a query" : ": an ID is one word"
        message += "; write an ID with spaces, operators or quotes as JSON (\(JSON.string(.string(t))))"
        if let query { message += ", or select by query with `\(query)`" }
        throw UsageError(message)
    }

    /// A field path in query syntax.
    static func path(_ text: Substring) throws -> FieldPath {
        try FieldPath(querySyntax: String(text))
    }

    static func strategy(_ text: Substring) throws -> WriteStrategy {
        guard let strategy = WriteStrategy(rawValue: String(text)) else {
            let names = WriteStrategy.allCases.map(\.rawValue).joined(separator: ", ")
            throw UsageError("unknown write strategy '\(text)'; use one of \(names)")
        }
        return strategy
    }

    /// `{JSON} [--strategy NAME]` or `--strategy NAME {JSON}` (also `--strategy=NAME`).
    static func upsert(_ text: Substring) throws -> (document: Value, strategy: WriteStrategy) {
        var rest = text.drop(while: \.isWhitespace)
        var strategy: WriteStrategy?
        func takeFlag(_ chunks: [Chunk], at i: Int) throws -> Int {
            let flag = chunks[i].text
            if flag.hasPrefix("--strategy=") {
                strategy = try Self.strategy(flag.dropFirst("--strategy=".count))
                return 1
            }
            guard i + 1 < chunks.count else { throw UsageError("--strategy needs a value") }
            strategy = try Self.strategy(chunks[i + 1].text)
            return 2
        }
        // Text that does not even split (an unclosed brace or string) is no JSON: say so.
        guard let chunks = try? Self.chunks(rest) else { return (try JSON.parse(String(rest)), .merge) }
        guard !chunks.isEmpty else { throw UsageError("upsert needs a JSON document") }
        if chunks[0].text.hasPrefix("--") {
            guard chunks[0].text.hasPrefix("--strategy") else {
                throw UsageError("unknown flag '\(chunks[0].text)'; upsert takes --strategy")
            }
            let used = try takeFlag(chunks, at: 0)
            guard chunks.count > used else { throw UsageError("upsert needs a JSON document") }
            rest = rest[chunks[used].range.lowerBound...]
        } else if let flag = chunks.lastIndex(where: { $0.text.hasPrefix("--strategy") }), flag > 0 {
            let used = try takeFlag(chunks, at: flag)
            guard flag + used == chunks.count else {
                throw UsageError("unexpected '\(chunks[flag + used].text)' after --strategy")
            }
            rest = rest[..<chunks[flag].range.lowerBound]
        }
        let document = try JSON.parse(String(rest))
        return (document, strategy ?? .merge)
    }

    /// `set PATH JSON`, `set-default PATH JSON`, `unset PATH` or `increment PATH NUMBER`.
    static func mutation(_ text: Substring) throws -> DocumentMutation {
        let chunks = try Self.chunks(text)
        guard let verb = chunks.first?.text else {
            throw UsageError("missing mutation: set, set-default, unset or increment")
        }
        guard chunks.count >= 2 else { throw UsageError("\(verb) needs a PATH") }
        let path = try Self.path(chunks[1].text)
        let operand = chunks.count > 2 ? text[chunks[2].range.lowerBound...] : ""
        switch verb {
        case "set", "set-default":
            guard !operand.isEmpty else { throw UsageError("\(verb) \(path) needs a JSON value") }
            let value: Value
            do { value = try JSON.parse(String(operand)) } catch {
                throw UsageError("\(verb) \(path) needs a JSON value like 5, \"text\" or {\"a\": 1}: \(error)")
            }
            return .set(path, value, isDefault: verb == "set-default")
        case "unset":
            guard operand.isEmpty else { throw UsageError("unexpected '\(operand)' after unset \(path)") }
            return .unset(path)
        case "increment":
            // A JSON number: `2` increments by the int 2 (the counter stays exact), `2.5` by a double.
            guard chunks.count == 3, let amount = try? JSON.parse(String(chunks[2].text)), amount.isCounterNumber
            else {
                throw UsageError("increment \(path) needs one finite NUMBER, got '\(operand)'")
            }
            return .increment(path, amount)
        default:
            throw UsageError("unknown mutation '\(verb)'; use set, set-default, unset or increment")
        }
    }

    /// A query followed by modifiers.
    struct Find {
        var query = "true"
        var sort: [(path: String, direction: SortDirection)] = []
        var limit: Int?
        var offset: Int?
        /// Values for the query's `$args.NAME` references.
        var args = UTF8Map<Value>()

        /// `find QUERY` with these modifiers on `collection`.
        func operation(on collection: TrellisCollection) -> PendingCursorOperation {
            var operation = collection.find(query, args: args)
            for (path, direction) in sort { operation = operation.sort(path, direction: direction) }
            if let limit { operation = operation.limit(limit) }
            if let offset { operation = operation.offset(offset) }
            return operation
        }
    }

    static let modifierKeywords: Set<Substring> = ["sort", "limit", "offset", "args"]

    /// `[QUERY] [sort PATH [asc|desc]]... [limit N] [offset N] [args {JSON}]`.
    ///
    /// The modifiers start at the first chunk `sort`, `limit`, `offset` or `args` (outside quotes)
    /// that follows a complete query (or nothing) and is not followed by an operator, so fields
    /// named like them still work in the query (`limit > 3 limit 2`).
    static func find(_ text: Substring) throws -> Find {
        let chunks = try Self.chunks(text)
        var result = Find()
        var start = chunks.count
        for (i, chunk) in chunks.enumerated() where modifierKeywords.contains(chunk.text) {
            let prefix = text[..<chunk.range.lowerBound].trimmingCharacters(in: .whitespaces)
            if i + 1 < chunks.count, looksLikeOperator(chunks[i + 1].text) { continue }
            if !prefix.isEmpty, (try? Query(prefix)) == nil { continue }
            start = i
            break
        }
        let queryText =
            start < chunks.count ? text[..<chunks[start].range.lowerBound] : text
        let trimmed = queryText.trimmingCharacters(in: .whitespaces)
        if !trimmed.isEmpty { result.query = trimmed }
        var i = start
        func number(_ keyword: Substring) throws -> Int {
            // Digits only: `+2` and `-1` are refused (Int("+2") would accept the first).
            guard i + 1 < chunks.count, chunks[i + 1].text.first?.isNumber == true, let n = Int(chunks[i + 1].text)
            else {
                let got = i + 1 < chunks.count ? "'\(chunks[i + 1].text)'" : "nothing"
                throw UsageError("\(keyword) needs a whole number >= 0, got \(got)")
            }
            i += 2
            return n
        }
        while i < chunks.count {
            let keyword = chunks[i].text
            switch keyword {
            case "sort":
                guard i + 1 < chunks.count else { throw UsageError("sort needs a PATH") }
                let path = String(chunks[i + 1].text)
                _ = try Self.path(chunks[i + 1].text)
                i += 2
                var direction = SortDirection.ascending
                if i < chunks.count, ["asc", "desc", "ascending", "descending"].contains(chunks[i].text) {
                    direction = chunks[i].text.hasPrefix("desc") ? .descending : .ascending
                    i += 1
                }
                result.sort.append((path, direction))
            case "limit":
                guard result.limit == nil else { throw UsageError("limit given twice") }
                result.limit = try number(keyword)
            case "offset":
                guard result.offset == nil else { throw UsageError("offset given twice") }
                result.offset = try number(keyword)
            case "args":
                guard result.args.isEmpty else { throw UsageError("args given twice") }
                let parsed = i + 1 < chunks.count ? Result { try JSON.parse(String(chunks[i + 1].text)) } : nil
                guard case .success(.map(let args))? = parsed else {
                    var got = i + 1 < chunks.count ? "'\(chunks[i + 1].text)'" : "nothing"
                    // Text that is not JSON at all: say why.
                    if case .failure(let error)? = parsed { got += " (\(error))" }
                    throw UsageError(#"args needs a JSON object such as {"min": 6} (for $args.min), got \#(got)"#)
                }
                result.args = args
                i += 2
            default:
                throw UsageError(
                    "unexpected '\(keyword)'; after the query come sort PATH [asc|desc], limit N, offset N, args {JSON}"
                )
            }
        }
        return result
    }

    static let mutationVerbs: Set<Substring> = ["set", "set-default", "unset", "increment"]

    /// `QUERY [modifiers] M[; M]...` of `update COLLECTION where …`: the mutations start at the
    /// first `set`, `set-default`, `unset` or `increment` (outside quotes) that follows a complete
    /// query with its modifiers and is not followed by an operator (as the modifiers do, so a
    /// field named `set` still works in the query).
    ///
    /// - Throws: ``UsageError`` when no mutation follows a valid query; the query's own error
    ///   when the text before the first mutation word does not parse.
    static func updateWhere(_ text: Substring) throws -> (find: Find, mutations: [DocumentMutation]) {
        let chunks = try Self.chunks(text)
        var firstError: (any Error)?
        for (i, chunk) in chunks.enumerated() where mutationVerbs.contains(chunk.text) {
            if i + 1 < chunks.count, looksLikeOperator(chunks[i + 1].text) { continue }
            let find: Find
            do { find = try Self.find(text[..<chunk.range.lowerBound]) } catch {
                firstError = firstError ?? error
                continue
            }
            let statements = try splitStatements(text[chunk.range.lowerBound...])
                .filter { !$0.allSatisfy(\.isWhitespace) }
            return (find, try statements.map(mutation))
        }
        if let firstError { throw firstError }
        throw UsageError(
            "update … where QUERY needs mutations after the query: set PATH JSON, set-default PATH JSON, "
                + "unset PATH or increment PATH NUMBER")
    }

    static func looksLikeOperator(_ chunk: Substring) -> Bool {
        if chunk == "IN" || chunk == "in" { return true }
        guard let first = chunk.first else { return false }
        return "=!<>&|),]".contains(first)
    }
}
