import Testing

@Test func placeholderTrellisCLITests() { #expect(Bool(true)) }
