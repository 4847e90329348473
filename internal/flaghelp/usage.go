// Package flaghelp writes the flag list of a command's help from its flag.FlagSet,
// so that help cannot drift from the flags a command really has, in the one
// format the launcher and the worker share:
//
//	--name TYPE   description (default X)
//
// and turns the flag package's parse errors into one line that names the flag.
package flaghelp

import (
	"flag"
	"fmt"
	"io"
	"regexp"
	"strings"
)

// Name is how a flag is written on a command line: -f for one letter, --name
// otherwise (the flag package takes either).
func Name(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// Flags writes every flag of fs, sorted by name, one a line: its name, the
// kind of value it takes (a word in `backquotes` in its usage, else its type;
// none for a bool), its one-line usage and its default when that is not the
// zero value and the usage does not state it. A FlagSet without flags writes
// "  (none)".
func Flags(w io.Writer, fs *flag.FlagSet) {
	type row struct{ left, right string }
	var rows []row
	width := 0
	fs.VisitAll(func(f *flag.Flag) {
		kind, text := flag.UnquoteUsage(f)
		left := Name(f.Name)
		if kind != "" {
			switch kind {
			case "value":
				kind = "VALUE"
			case "float":
				kind = "NUMBER"
			}
			left += " " + strings.ToUpper(kind)
		}
		if d := f.DefValue; !zero(d) && !strings.Contains(text, "(default") {
			text += " (default " + d + ")"
		}
		rows = append(rows, row{left, text})
		width = max(width, len(left))
	})
	if len(rows) == 0 {
		fmt.Fprintln(w, "  (none)")
		return
	}
	for _, r := range rows {
		fmt.Fprintf(w, "  %-*s  %s\n", width, r.left, r.right)
	}
}

// zero reports whether a default is the zero value of its flag's type: shown
// as nothing (an empty string, off, no time).
func zero(def string) bool {
	switch def {
	case "", "0", "false", "0s":
		return true
	}
	return false
}

// flagRE finds the flag a parse error names ("for flag -x", "for -x",
// "argument: -x").
var flagRE = regexp.MustCompile(`(for flag|for|argument:) -[A-Za-z0-9][A-Za-z0-9_.-]*`)

// Error rewrites an error of fs.Parse as one line naming the flag as it is
// written (--name): an unknown flag with the nearest known one when the name
// looks like a typo of it.
func Error(fs *flag.FlagSet, err error) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		name = strings.TrimPrefix(name, "-")
		msg = "unknown flag " + Name(name)
		if near := nearest(fs, name); near != "" {
			msg += "; did you mean " + Name(near) + "?"
		}
		return fmt.Errorf("%s", msg)
	}
	msg = flagRE.ReplaceAllStringFunc(msg, func(m string) string {
		i := strings.LastIndex(m, " -")
		return m[:i+1] + Name(m[i+2:])
	})
	return fmt.Errorf("%s", msg)
}

// nearest is the flag of fs nearest to name when name looks like a typo of
// it: one edit away (a letter added, dropped, changed, or two swapped), two
// for names longer than four letters; "" when none is (or name is too short
// to tell a typo from another flag).
func nearest(fs *flag.FlagSet, name string) string {
	if len(name) < 3 {
		return ""
	}
	limit := 1
	if len(name) > 4 {
		limit = 2
	}
	best, bestD := "", limit+1
	fs.VisitAll(func(f *flag.Flag) {
		if d := distance(name, f.Name); d < bestD {
			best, bestD = f.Name, d
		}
	})
	return best
}

// distance is the optimal string alignment distance between a and b: the
// edits (insert, delete, substitute, swap two neighbours) that turn a into b.
func distance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// Interspersed parses flags that may come before or after the positional
// arguments, which it returns.
func Interspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return pos, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// Help is a command's -h: its usage lines head, then every flag of fs with
// its default (from the FlagSet itself, so it cannot drift from the flags).
func Help(head string, fs *flag.FlagSet) string {
	var b strings.Builder
	b.WriteString(head)
	b.WriteString("\nflags:\n")
	Flags(&b, fs)
	return b.String()
}

// CommandError is a bad flag of command cmd (fs.Parse's error) as one line
// that names the flag (as Error does) and points at cmd -h.
func CommandError(cmd string, fs *flag.FlagSet, err error) error {
	return fmt.Errorf("%v (%s -h lists the flags)", Error(fs, err), cmd)
}
