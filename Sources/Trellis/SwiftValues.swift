public import Dispatch
import Foundation
public import TrellisStore

// Swift values where Ditto's API takes them: `[String: Any?]` documents, `String` document IDs
// (an `_id` is a string or a map in Trellis), Codable types, `doc["name"] = value` on a mutable document, and the
// `eventHandler:` label of `observeLocal`. Each overload is disfavored where it competes with the
// `Value` form, so literals keep meaning what they meant (`["v": 1]` is a `Value`), and variables
// of Swift types reach these.

/// A Swift value that has no document value: the problem and where it is.
public struct ValueConversionError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Where in the converted value, as a field path (`tags[2]`, `address.zip`; empty for the
    /// value itself).
    public var path: String
    /// The Swift type found there, or the problem (`UInt64 18446744073709551615 above Int64.max`).
    public var problem: String

    public init(path: String, problem: String) {
        self.path = path
        self.problem = problem
    }

    /// The error in words.
    public var description: String {
        (path.isEmpty ? "value" : "value at \(path)") + " cannot be stored: \(problem) "
            + "(a document holds nil, Bool, integers, Double, String, Data or [UInt8], arrays and "
            + "[String: …] maps of these, and Value)"
    }
}

extension Value {
    /// Converts a Swift value as Ditto's documents hold them (`[String: Any?]`).
    ///
    /// `nil` and `NSNull` are `.null`; `Bool` is `.bool`; `Int`, `Int8`…`Int64` and unsigned
    /// integers up to `Int64.max` are `.int`; `Double` and `Float` are `.double`; `String`,
    /// `Substring` and `Character` are `.string`; `Data` and `[UInt8]` are `.bytes`; arrays are
    /// `.array` and `[String: …]` dictionaries `.map`, converted element by element; a ``Value`` is
    /// itself. Anything else is refused, never converted silently (a `Date` needs a choice of
    /// format: store `date.timeIntervalSince1970` or an ISO 8601 string).
    ///
    /// - Throws: ``ValueConversionError`` naming the path and type of the first value refused.
    /// - Complexity: O(size of the value).
    public init(converting value: Any?) throws(ValueConversionError) {
        self = try Self.convert(value, path: "")
    }

    private static func convert(_ value: Any?, path: String) throws(ValueConversionError) -> Value {
        guard let value else { return .null }
        // An `Any` may hold an Optional: look inside it.
        let mirror = Mirror(reflecting: value)
        if mirror.displayStyle == .optional {
            guard let inner = mirror.children.first?.value else { return .null }
            return try convert(inner, path: path)
        }
        switch value {
        case let value as Value: return value
        case is NSNull: return .null
        case let value as Bool: return .bool(value)
        case let value as Int: return .int(Int64(value))
        case let value as Int64: return .int(value)
        case let value as Int32: return .int(Int64(value))
        case let value as Int16: return .int(Int64(value))
        case let value as Int8: return .int(Int64(value))
        case let value as UInt8: return .int(Int64(value))
        case let value as UInt16: return .int(Int64(value))
        case let value as UInt32: return .int(Int64(value))
        case let value as UInt:
            guard let exact = Int64(exactly: value) else {
                throw ValueConversionError(path: path, problem: "UInt \(value) above Int64.max")
            }
            return .int(exact)
        case let value as UInt64:
            guard let exact = Int64(exactly: value) else {
                throw ValueConversionError(path: path, problem: "UInt64 \(value) above Int64.max")
            }
            return .int(exact)
        case let value as Double: return .double(value)
        case let value as Float: return .double(Double(value))
        case let value as String: return .string(value)
        case let value as Substring: return .string(String(value))
        case let value as Character: return .string(String(value))
        case let value as Data: return .bytes([UInt8](value))
        case let value as [UInt8]: return .bytes(value)
        // Any dictionary with String keys and any array cast to these (`[String: Int]`, `[Any]`).
        case let value as [String: Any?]:
            var map = UTF8Map<Value>()
            for (key, element) in value { map[key] = try convert(element, path: Self.join(path, key)) }
            return .map(map)
        case let value as [Any?]:
            var array: [Value] = []
            array.reserveCapacity(value.count)
            for (index, element) in value.enumerated() { array.append(try convert(element, path: "\(path)[\(index)]")) }
            return .array(array)
        default:
            throw ValueConversionError(path: path, problem: "a \(type(of: value))")
        }
    }

    private static func join(_ path: String, _ key: String) -> String { path.isEmpty ? key : "\(path).\(key)" }

    /// The value as Swift values, as Ditto's `DittoDocument.value` gives it: `nil` for `.null`,
    /// `Bool`, `Int` (an `.int`), `Double`, `String`, `Data` (`.bytes`), `[Any?]` and
    /// `[String: Any?]`.
    ///
    /// - Complexity: O(size of the value).
    public var anyValue: Any? {
        switch self {
        case .null: return nil
        case .bool(let value): return value
        case .int(let value): return Int(value)
        case .double(let value): return value
        case .string(let value): return value
        case .bytes(let value): return Data(value)
        case .array(let values): return values.map(\.anyValue)
        case .map(let map):
            var dictionary: [String: Any?] = [:]
            for (key, value) in map { dictionary[key] = value.anyValue }
            return dictionary
        }
    }
}

extension TrellisCollection {
    /// The document with this string `_id` (Ditto's `findByID(_:)` with a `String`).
    public func findByID(_ id: String) -> PendingIDSpecificOperation {
        findByID(Value.string(id))
    }

    /// Upserts a document given as Swift values, as DittoSwift's `upsert(_:writeStrategy:)`
    /// takes it: `try cars.upsert(["_id": id, "make": make, "year": year])` with variables.
    ///
    /// - Parameters:
    ///   - document: field names and values (``Value/init(converting:)``); `_id` is generated
    ///     when absent.
    ///   - writeStrategy: as ``upsert(_:writeStrategy:)-(Value,_)``.
    /// - Returns: the document's `_id`.
    /// - Throws: ``ValueConversionError`` for a value a document cannot hold (nothing is written),
    ///   then as ``upsert(_:writeStrategy:)-(Value,_)``.
    /// - Complexity: O(size of the document) plus one indexed lookup.
    @_disfavoredOverload @discardableResult
    public func upsert(_ document: [String: Any?], writeStrategy: WriteStrategy = .merge) throws -> Value {
        try upsert(Value(converting: document), writeStrategy: writeStrategy)
    }

    /// Upserts an `Encodable` value as a document: its JSON encoding (`JSONEncoder`, default
    /// strategies: a `Date` becomes seconds since 2001, `Data` base64) becomes the fields. Give
    /// the type an `_id` field (or a `CodingKeys` case `id = "_id"`); without one an `_id` is
    /// generated.
    ///
    /// - Throws: `EncodingError`, ``StoreError`` when the encoding is not a JSON object, then as
    ///   ``upsert(_:writeStrategy:)-(Value,_)``.
    /// - Complexity: O(size of the encoding).
    @_disfavoredOverload @discardableResult
    public func upsert<T: Encodable>(_ document: T, writeStrategy: WriteStrategy = .merge) throws -> Value {
        let value = try JSON.parse(JSONEncoder().encode(document))
        guard case .map = value else {
            throw StoreError.invalidValue("a \(T.self) encodes as \(JSON.string(value).prefix(40)), not a JSON object")
        }
        return try upsert(value, writeStrategy: writeStrategy)
    }
}

extension Document {
    /// The document decoded as a `Decodable` type from its JSON (`JSONDecoder`, default strategies;
    /// the `_id` field is there as `_id`).
    ///
    /// - Throws: `DecodingError` naming the field that does not fit.
    /// - Complexity: O(size of the document).
    public func typed<T: Decodable>(as type: T.Type) throws -> T {
        try JSONDecoder().decode(T.self, from: Data(json.utf8))
    }
}

extension MutableDocument {
    /// The top-level field `key` as Swift values (``Value/anyValue``); assigning records a set
    /// (`doc["name"] = "Frank"`, Ditto's subscript assignment), `nil` sets it to null. A value a
    /// document cannot hold (``Value/init(converting:)``) makes `update` throw and write nothing.
    @_disfavoredOverload
    public subscript(key: String) -> Any? {
        get { self[key].value?.anyValue }
        set { self[key].assign(newValue) }
    }
}

extension MutableDocumentPath {
    /// The map entry `key` below this path as Swift values; assigning records a set
    /// (`doc["address"]["city"] = city`).
    @_disfavoredOverload
    public subscript(key: String) -> Any? {
        get { self[key].value?.anyValue }
        nonmutating set { self[key].assign(newValue) }
    }

    /// Records a set of a Swift value, or the conversion's failure.
    func assign(_ newValue: Any?) {
        do throws(ValueConversionError) {
            set(try Value(converting: newValue))
        } catch {
            document.fail(error)
        }
    }
}

extension PendingCursorOperation {
    /// ``observeLocal(deliverOn:_:)`` with DittoSwift's `eventHandler:` label.
    @_disfavoredOverload
    public func observeLocal(
        deliverOn queue: DispatchQueue = LiveQuery.defaultDeliveryQueue,
        eventHandler: @escaping @Sendable ([Document], LiveQueryEvent) -> Void
    ) throws -> LiveQuery {
        try observeLocal(deliverOn: queue, eventHandler)
    }

    /// ``observeLocalWithNextSignal(deliverOn:_:)`` with DittoSwift's `eventHandler:` label.
    @_disfavoredOverload
    public func observeLocalWithNextSignal(
        deliverOn queue: DispatchQueue = LiveQuery.defaultDeliveryQueue,
        eventHandler: @escaping @Sendable ([Document], LiveQueryEvent, @escaping @Sendable () -> Void) -> Void
    ) throws -> LiveQuery {
        try observeLocalWithNextSignal(deliverOn: queue, eventHandler)
    }
}

extension PendingIDSpecificOperation {
    /// ``observeLocal(deliverOn:_:)`` with DittoSwift's `eventHandler:` label.
    @_disfavoredOverload
    public func observeLocal(
        deliverOn queue: DispatchQueue = LiveQuery.defaultDeliveryQueue,
        eventHandler: @escaping @Sendable (Document?, SingleDocumentLiveQueryEvent) -> Void
    ) throws -> LiveQuery {
        try observeLocal(deliverOn: queue, eventHandler)
    }

    /// ``observeLocalWithNextSignal(deliverOn:_:)`` with DittoSwift's `eventHandler:` label.
    @_disfavoredOverload
    public func observeLocalWithNextSignal(
        deliverOn queue: DispatchQueue = LiveQuery.defaultDeliveryQueue,
        eventHandler:
            @escaping @Sendable (Document?, SingleDocumentLiveQueryEvent, @escaping @Sendable () -> Void) -> Void
    ) throws -> LiveQuery {
        try observeLocalWithNextSignal(deliverOn: queue, eventHandler)
    }
}
