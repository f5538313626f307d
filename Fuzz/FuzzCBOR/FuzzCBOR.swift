// libFuzzer entry point for the CBOR decoders. Build and run: see Fuzz/README.md.
import TrellisCore

/// Decodes arbitrary bytes as a `Value` and as a `CBORItem`. Decoding may fail, but never trap;
/// whatever decodes must re-encode to bytes that decode to the same thing, and `Value` encodings
/// must pass the strict deterministic decoder.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzCBOR(_ start: UnsafeRawPointer?, _ count: Int) -> CInt {
    let input = start.map { [UInt8](UnsafeRawBufferPointer(start: $0, count: count)) } ?? []

    if let value = try? CBOR.decode(input) {
        let encoded = CBOR.encode(value)
        let strict = CBOR.DecodingOptions(requireDeterministic: true)
        guard let again = try? CBOR.decode(encoded, options: strict), again == value else {
            fatalError("Value round trip failed: \(value) encoded as \(encoded)")
        }
        guard CBOR.encode(again) == encoded else {
            fatalError("Value encoding not deterministic for \(value)")
        }
    }

    if let item = try? CBOR.decodeItem(input) {
        let encoded = CBOR.encodeItem(item)
        guard let again = try? CBOR.decodeItem(encoded), CBOR.encodeItem(again) == encoded else {
            fatalError("CBORItem round trip failed: \(item) encoded as \(encoded)")
        }
    }
    return 0
}
