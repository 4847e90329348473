package launch

import "github.com/meshrun/meshrun/internal/goldenfile"

// golden compares got with the file at path, or rewrites the file with -update.
var golden = goldenfile.Check
