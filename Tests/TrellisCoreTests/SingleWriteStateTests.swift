import Testing
import TrellisCore

/// The single-write form of a state (docs/PROTOCOL.md §3): its bytes, what it stands for, and
/// what a receiver refuses.
@Suite struct SingleWriteStateTests {
    let stamp = Stamp(time: HLCTimestamp(millis: 1000, logical: 0), site: 1)

    /// The bytes of the protocol document's example, and the state they stand for.
    @Test func theFormIsAMapOfTheJSONAndTheStamp() throws {
        let json = "{\"_id\":\"d\",\"m\":{\"k\":[1,2.5,\"z\"]},\"n\":1}"
        let bytes = SingleWriteState(stamp: stamp, json: json).encoded()
        #expect(
            bytes == [0xA2, 0x61, 0x6A, 0x78, UInt8(json.utf8.count)] + Array(json.utf8) + [
                0x61, 0x75, 0x82, 0x1A, 0x03, 0xE8, 0x00, 0x00, 0x01,
            ])
        #expect(SingleWriteState.isEncoded(bytes))
        #expect(try SingleWriteState.decode(bytes) == SingleWriteState(stamp: stamp, json: json))
        let expected = DocumentState(fields: ["m": ["k": [1, 2.5, "z"]], "n": 1], stamp: stamp)
        #expect(try DocumentState(bytes: bytes, id: "d") == expected)
        // The whole state's encoding is another form, read by the same initializer.
        #expect(!SingleWriteState.isEncoded(expected.cbor()))
        #expect(try SingleWriteState.decode(expected.cbor()) == nil)
        #expect(try DocumentState(bytes: expected.cbor()) == expected)
    }

    /// Another spelling of the same content (here a stamp time in an eight-byte head where four
    /// suffice) is not what Trellis writes, so it skips the quick reader, and still decodes.
    @Test func aLongerSpellingStillDecodes() throws {
        let json = "{\"_id\":\"d\",\"n\":1}"
        let bytes: [UInt8] =
            [0xA2, 0x61, 0x6A, 0x60 + UInt8(json.utf8.count)] + Array(json.utf8) + [
                0x61, 0x75, 0x82, 0x1B, 0, 0, 0, 0, 0x03, 0xE8, 0x00, 0x00, 0x01,
            ]
        #expect(bytes != SingleWriteState(stamp: stamp, json: json).encoded())
        #expect(try SingleWriteState.decode(bytes) == SingleWriteState(stamp: stamp, json: json))
    }

    /// A receiver stores the JSON it writes itself, whatever spelling the sender used.
    @Test func theStoredJSONIsTheCanonicalOne() throws {
        let single = SingleWriteState(stamp: stamp, json: "{ \"n\" : 1.50, \"_id\" : \"d\" }")
        let document = try single.document(id: "d")
        #expect(document.json == "{\"_id\":\"d\",\"n\":1.5}")
        #expect(document.fields == ["n": 1.5])
    }

    @Test(
        arguments: [
            ([0xA2, 0x61, 0x6A, 0x60, 0x61, 0x75, 0x81, 0x01], "malformed"),  // a stamp of one number
            ([0xA2, 0x61, 0x6A, 0x60, 0x61, 0x75, 0x82, 0x01, 0x61, 0x78], "malformed"),  // a text site
            ([0xA2, 0x61, 0x6A, 0x60, 0x61, 0x78, 0x82, 0x01, 0x02], "malformed"),  // "x", not "u"
            ([0xA2, 0x61, 0x6A, 0x60], "does not decode"),  // cut short
            ([0xA2, 0x61, 0x6A, 0x01, 0x61, 0x75, 0x82, 0x01, 0x02], "malformed"),  // the JSON is a number
        ] as [([UInt8], String)])
    func malformedFormsAreRefusedWithAReason(bytes: [UInt8], reason: String) {
        #expect(throws: DocumentStateError.self) { try SingleWriteState.decode(bytes) }
        do {
            _ = try SingleWriteState.decode(bytes)
        } catch {
            #expect(error.message.contains(reason), "\(error)")
        }
    }

    @Test func aDocumentWithoutItsIdOrWithAnotherIsRefused() {
        for (json, id, reason) in [
            ("{\"v\":1}", nil, "no _id"), ("{\"_id\":\"x\"}", "y", "not \"y\""), ("[]", nil, "not a map"),
            ("{\"_id\":\"x\",\"v\":{\"$bytes\":1}}", nil, "$bytes"), ("{\"_id\":\"x\",", nil, "parse"),
        ] as [(String, Value?, String)] {
            do {
                _ = try SingleWriteState(stamp: stamp, json: json).state(id: id)
                Issue.record("\(json) was accepted")
            } catch {
                #expect(error.message.contains(reason), "\(json): \(error)")
            }
        }
    }
}
