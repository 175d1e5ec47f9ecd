package shared

// FNV-1a 64-bit parameters (the FNV specification, draft-eastlake-fnv,
// and Go's hash/fnv): the offset basis and the prime.
const (
	fnv64Offset uint64 = 14695981039346656037 // 0xcbf29ce484222325
	fnv64Prime  uint64 = 1099511628211        // 0x00000100000001b3
)

// WorkerIDOf is the WorkerID of the worker named name, the one id scheme of
// every face (router serve, router epp, router replay): the FNV-1a 64-bit
// hash of the name's UTF-8 bytes. Starting from h = 14695981039346656037
// (0xcbf29ce484222325), for each byte b of the name: h ^= b, then
// h *= 1099511628211 (0x100000001b3), modulo 2^64. The empty name hashes to
// the offset basis. A plugin in any language can compute it to recognise a
// worker it knows by name (docs/plugin-protocol.md, "Ids").
//
// Examples: WorkerIDOf("a") = 12638187200555641996 (0xaf63dc4c8601ec8c),
// WorkerIDOf("sim-3") = 1266439823738918328 (0x11934c4f4f5dd5b8).
func WorkerIDOf(name string) WorkerID {
	h := fnv64Offset
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= fnv64Prime
	}
	return WorkerID(h)
}
