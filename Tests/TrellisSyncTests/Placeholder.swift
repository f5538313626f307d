import Testing

@Test func placeholderTrellisSyncTests() { #expect(Bool(true)) }
