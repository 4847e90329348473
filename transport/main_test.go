package transport_test

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	if os.Getenv("MESHRUN_TEST_SQUATTER") != "" {
		os.Exit(squatterMain()) // TestShmSquatter's process of another uid
	}
	os.Exit(m.Run())
}
