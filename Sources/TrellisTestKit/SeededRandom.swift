import Foundation
import TrellisCore

/// A small, fast, seedable random number generator (SplitMix64) for reproducible tests.
///
/// Source: Steele, Lea, Flood, "Fast Splittable Pseudorandom Number Generators" (OOPSLA 2014);
/// constants from Vigna's reference `splitmix64.c`. Not for cryptography.
///
/// Randomised tests take their seed from ``fromEnvironment(default:)``, print it, and replay a
/// failure with `TRELLIS_SEED=<seed> swift test --filter <test>`.
public struct SeededRandom: RandomNumberGenerator, Sendable {
    /// The generator: the pure core's ``SplitMix64``, so tests and the simulator draw the same
    /// sequences from the same seed.
    private var generator: SplitMix64

    /// The generator's state; the next output is a function of it alone.
    public var state: UInt64 { generator.state }

    /// A generator whose sequence is fixed by `seed`.
    public init(seed: UInt64) {
        generator = SplitMix64(seed: seed)
    }

    /// The next 64 random bits (one SplitMix64 step).
    public mutating func next() -> UInt64 { generator.next() }

    /// The environment variable that overrides the seed of randomised tests.
    public static let environmentVariable = "TRELLIS_SEED"

    /// A generator seeded from `TRELLIS_SEED` when set (decimal, or hex with `0x`), otherwise
    /// from `default`.
    ///
    /// - Parameter seed: the seed to use when `TRELLIS_SEED` is unset, typically
    ///   `UInt64.random(in: .min ... .max)` for fresh coverage each run, or a constant.
    /// - Returns: the generator and the seed it started from, for the test to print.
    /// - Precondition: `TRELLIS_SEED`, when set, parses; a replay must never quietly run another seed.
    public static func fromEnvironment(default seed: UInt64) -> (SeededRandom, UInt64) {
        fromEnvironment(default: seed, environment: ProcessInfo.processInfo.environment)
    }

    /// ``fromEnvironment(default:)`` reading from the given environment instead of the process's.
    public static func fromEnvironment(
        default seed: UInt64, environment: [String: String]
    ) -> (SeededRandom, UInt64) {
        guard let text = environment[environmentVariable] else {
            return (SeededRandom(seed: seed), seed)
        }
        guard let parsed = parseSeed(text) else {
            preconditionFailure("\(environmentVariable)='\(text)' is not a UInt64 (decimal or 0x-prefixed hex)")
        }
        return (SeededRandom(seed: parsed), parsed)
    }

    /// Parses a seed written in decimal or as `0x`-prefixed hex; `nil` when it is neither.
    public static func parseSeed(_ text: String) -> UInt64? {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        if trimmed.hasPrefix("0x") || trimmed.hasPrefix("0X") {
            return UInt64(trimmed.dropFirst(2), radix: 16)
        }
        return UInt64(trimmed)
    }
}
