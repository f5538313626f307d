import Testing

@Test func placeholderTrellisCoreTests() { #expect(Bool(true)) }
