import Testing

@Test func placeholderTrellisStoreTests() { #expect(Bool(true)) }
