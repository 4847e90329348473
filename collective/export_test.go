package collective

// SetShmCreateHook makes f run before every ring file is created, with its
// path; the returned function removes it.
func SetShmCreateHook(f func(path string)) (restore func()) {
	testHookShmCreate = f
	return func() { testHookShmCreate = nil }
}

// DecodeRoster reads the roster as rank 0 publishes it (one chunk's body).
var DecodeRoster = decodeRoster
