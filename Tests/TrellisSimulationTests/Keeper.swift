import Trellis
import TrellisSimulation

extension Simulation {
    /// Adds a node named `name`, linked to `remover` alone and subscribed to the whole
    /// `collection`, to list on the remover's side of every partition: it acknowledges the
    /// remover's removes. The reaper keeps the tombstone of a remove no peer has acknowledged (a
    /// remove reaped before any peer had it is lost: seed 4500046, `ExpirySweepTests`), so a
    /// scenario about a remover that reaped while its other peers were away needs one.
    ///
    /// - Returns: the node and its subscription, which the caller keeps alive.
    func addKeeper(beside remover: SimulatedNode, name: String = "k", collection: String = "items") throws -> (
        SimulatedNode, Subscription
    ) {
        let keeper = try addNode(name)
        connect(keeper, remover)
        return (keeper, try keeper.store.collection(collection).findAll().subscribe())
    }
}
