// TrellisTestKit: helpers shared by Trellis's test targets.
//
// - `SeededRandom`: a SplitMix64 generator seeded from `TRELLIS_SEED` for replayable tests.
// - `randomValue(depth:using:)` and friends: random `Value` trees for property tests.
