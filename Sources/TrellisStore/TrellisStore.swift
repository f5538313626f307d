// \(t) module.
