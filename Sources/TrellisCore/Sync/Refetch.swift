/// Asking peers again for evicted documents, and only for them (F10).
///
/// A node that evicts documents while one of its subscriptions (or a subscription it relays) in
/// the collection is active asks its peers for exactly those `_id`s again, through a
/// **refetch subscription** derived from each such subscription: the same collection, the query
/// `(q) && _id IN $args.trellisEvicted` and the original arguments plus the list of `_id`s. The
/// sender reads only the rows of those `_id`s (its store looks them up by key) and sends those
/// that match `q`, tombstones included; nobody re-sends the rest of the collection. The subscriber
/// then holds those tombstones, so the sender records them in the scope of the subscription `q`
/// (``base(of:)``): a later change to such a document reaches the subscriber although it matches
/// neither before nor after. A refetch subscription stores no checkpoint and is dropped once every
/// listed document has arrived (or its collection has no subscription left).
public enum Refetch {
    /// The argument holding the `_id`s of a refetch subscription.
    public static let argument = "trellisEvicted"
    /// At most this many `_id`s per refetch subscription (a longer list is split).
    public static let chunk = 256
    /// At most this many evicted `_id`s are asked for again per collection; beyond, the oldest are
    /// not (they come back when their subscription is made again, which asks the store for its
    /// evicted documents).
    public static let maxPerCollection = 4096

    /// The refetch subscriptions derived from `spec` for `ids`, `chunk` `_id`s each.
    public static func specs(for spec: SubscriptionSpec, ids: [Value]) -> [SubscriptionSpec] {
        stride(from: 0, to: ids.count, by: chunk).map { start in
            var args = spec.args
            args[argument] = .array(Array(ids[start..<min(ids.count, start + chunk)]))
            return SubscriptionSpec(
                collection: spec.collection, query: "(\(spec.query)) && _id IN $args.\(argument)", args: args)
        }
    }

    /// The subscription a refetch subscription was derived from (``specs(for:ids:)``): its query
    /// `q` and its arguments without ``argument``, or `nil` when `spec` is not a refetch
    /// subscription of that exact shape `(q) && _id IN $args.trellisEvicted`. The text is not
    /// parsed here: a `q` that does not parse on its own names no subscription.
    ///
    /// - Complexity: O(length of the query text + number of arguments).
    public static func base(of spec: SubscriptionSpec) -> SubscriptionSpec? {
        let suffix = ") && _id IN $args.\(argument)"
        guard ids(of: spec) != nil, spec.query.hasPrefix("("), spec.query.hasSuffix(suffix),
            spec.query.utf8.count > suffix.utf8.count + 1
        else { return nil }
        var args = spec.args
        args[argument] = nil
        return SubscriptionSpec(
            collection: spec.collection, query: String(spec.query.dropFirst().dropLast(suffix.count)), args: args)
    }

    /// The `_id`s a refetch subscription asks for, or `nil` when `spec` is not one.
    public static func ids(of spec: SubscriptionSpec) -> [Value]? {
        guard case .array(let ids)? = spec.args[argument], spec.query.hasSuffix(" && _id IN $args.\(argument)")
        else { return nil }
        return ids
    }
}

/// A subscription of this node's own that names the argument ``Refetch/argument``
/// (`trellisEvicted`), reserved for the refetch subscriptions Trellis derives: peers would take
/// the subscription for one (served without scope records, no checkpoint stored), so documents
/// that leave it would not reach this node.
public struct ReservedArgumentError: Error, Equatable, Sendable, CustomStringConvertible {
    public var description: String {
        "the query argument name '\(Refetch.argument)' is reserved for the refetch subscriptions Trellis "
            + "derives from evictions; give the argument another name"
    }
}

/// The evicted documents of one collection being asked for again.
struct RefetchList: Sendable {
    /// The `_id`s asked for (fixed until the list is dropped, so the subscriptions keep their keys).
    var ids: [Value]
    /// The canonical keys of those not yet received, compared byte-wise: "é" (U+00E9) and "e" +
    /// U+0301 name two documents.
    var missing: Set<UTF8Key>
    /// Whether evicted `_id`s were left off the list (more than ``Refetch/maxPerCollection``):
    /// once every listed one has arrived, the rest are read from the store's stubs and asked for.
    var truncated = false

    /// Keeps the `limit` most recently listed `_id`s: those before them are no longer asked for
    /// on this list (``truncated``).
    mutating func keepNewest(_ limit: Int) {
        guard ids.count > limit else { return }
        truncated = true
        for id in ids.prefix(ids.count - limit) { missing.remove(UTF8Key(JSON.string(id))) }
        ids.removeFirst(ids.count - limit)
    }
}
