/// Asking peers again for evicted documents, and only for them (F10).
///
/// A node that evicts documents while one of its subscriptions (or a subscription it relays) in
/// the collection is active asks its peers for exactly those `_id`s again, through a
/// **refetch subscription** derived from each such subscription: the same collection, the query
/// `(q) && _id IN $args.trellisEvicted` and the original arguments plus the list of `_id`s. The
/// sender reads only the rows of those `_id`s (its store looks them up by key) and sends those
/// that match `q`, tombstones included; nobody re-sends the rest of the collection. A refetch
/// subscription stores no checkpoint and is dropped once every listed document has arrived (or
/// its collection has no subscription left).
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

    /// The `_id`s a refetch subscription asks for, or `nil` when `spec` is not one.
    public static func ids(of spec: SubscriptionSpec) -> [Value]? {
        guard case .array(let ids)? = spec.args[argument], spec.query.hasSuffix(" && _id IN $args.\(argument)")
        else { return nil }
        return ids
    }
}

/// The evicted documents of one collection being asked for again.
struct RefetchList: Sendable {
    /// The `_id`s asked for (fixed until the list is dropped, so the subscriptions keep their keys).
    var ids: [Value]
    /// The canonical keys of those not yet received.
    var missing: Set<String>
}
