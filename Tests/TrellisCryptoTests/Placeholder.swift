import Testing

@Test func placeholderTrellisCryptoTests() { #expect(Bool(true)) }
