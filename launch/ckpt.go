package launch

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/meshrun/meshrun/ckpt"
	"github.com/meshrun/meshrun/internal/flaghelp"
)

const ckptUsage = `usage: launcher ckpt inspect PATH             tensors, shapes, placements, files, step; verifies every checksum
       launcher ckpt convert PATH --to FILE     gather every tensor into one plain safetensors file

PATH is a checkpoint folder (step-N), a folder of checkpoints (the newest), or a
safetensors file. "launcher ckpt inspect -h", "launcher ckpt convert -h": their flags.
`

// ckptHelp is the usage of each ckpt subcommand.
var ckptHelp = map[string]string{
	"inspect": `usage: launcher ckpt inspect PATH
  the checkpoint's tensors, shapes, dtypes, placements, files and step; verifies every
  checksum and names the tensor and block of any damage (exit 2)
  PATH is a checkpoint folder (step-N), a folder of checkpoints (the newest), or a
  safetensors file
`,
	"convert": `usage: launcher ckpt convert PATH --to FILE
  gathers every tensor into one plain safetensors file (step and mesh in its metadata),
  verifying what it reads
  PATH is a checkpoint folder (step-N), a folder of checkpoints (the newest), or a
  safetensors file
`,
}

// ckptFlags are the flags of `launcher ckpt CMD`: convert's --to.
func ckptFlags(cmd string) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet("ckpt "+cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	to := new(string)
	if cmd == "convert" {
		fs.StringVar(to, "to", "", "the safetensors `FILE` to write (required)")
	}
	return fs, to
}

// ckptMain runs `launcher ckpt`. Bad or damaged input exits 2.
func ckptMain(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help") {
		fmt.Fprint(stdout, ckptUsage)
		return 0
	}
	if len(args) == 0 || ckptHelp[args[0]] == "" {
		fmt.Fprint(stderr, ckptUsage)
		return ExitUsage
	}
	name := "launcher ckpt " + args[0]
	fs, to := ckptFlags(args[0])
	pos, err := flaghelp.Interspersed(fs, args[1:])
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, flaghelp.Help(ckptHelp[args[0]], fs))
		return 0
	}
	if err != nil {
		err = flaghelp.CommandError(name, fs, err)
	} else if len(pos) == 0 {
		err = fmt.Errorf("PATH is required (%s -h)", name)
	} else if len(pos) > 1 {
		err = fmt.Errorf("one PATH, got %q", pos)
	} else if args[0] == "convert" && *to == "" {
		err = fmt.Errorf("--to FILE is required")
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return ExitUsage
	}
	path := pos[0]
	fail := func(err error) int {
		fmt.Fprintf(stderr, "launcher ckpt %s: %v\n", args[0], err)
		return ExitUsage
	}
	c, err := ckpt.Open(ckpt.OS, path)
	if err != nil {
		return fail(err)
	}
	switch args[0] {
	case "inspect":
		if err := inspect(stdout, c); err != nil {
			return fail(err)
		}
	case "convert":
		meta := map[string]string{"format": "meshrun", "step": fmt.Sprint(c.Index.Step), "mesh": c.Index.Mesh}
		info, err := ckpt.Convert(ckpt.OS, c, *to, meta)
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "wrote %s: %d tensors, %d bytes, CRC-32C %08x\n", *to, len(c.Names()), info.Size, info.CRC32C)
	}
	return 0
}

// inspect prints a checkpoint and verifies every file's checksum.
func inspect(w io.Writer, c *ckpt.Checkpoint) error {
	where := c.Dir
	if where == "" {
		where = "safetensors file"
	}
	var total int64
	for _, f := range c.Index.Files {
		total += f.Size
	}
	fmt.Fprintf(w, "checkpoint %s: step %d, written on mesh %q, %d files, %d bytes\n",
		where, c.Index.Step, c.Index.Mesh, len(c.Files()), total)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TENSOR\tSHAPE\tDTYPE\tPLACEMENTS\tBOXES (file: offset+shape)")
	for _, name := range c.Names() {
		t := c.Index.Tensors[name]
		var boxes []string
		for _, b := range t.Boxes {
			boxes = append(boxes, fmt.Sprintf("%s: %v+%v", b.File, b.Offset, b.Shape))
		}
		fmt.Fprintf(tw, "%s\t%v\t%s\t%s\t%s\n", name, t.Shape, t.DType, t.Placements, strings.Join(boxes, ", "))
	}
	tw.Flush()
	if err := c.Verify(); err != nil {
		return err
	}
	if c.Dir != "" {
		fmt.Fprintln(w, "verified: every file's size, header and CRC-32C match the index")
	}
	return nil
}
