package snapshot

// MarshalManifest is the writer's manifest encoding, for the golden test.
var MarshalManifest = marshalManifest
