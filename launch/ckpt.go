package launch

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/meshrun/meshrun/ckpt"
)

const ckptUsage = `usage: launcher ckpt inspect PATH             tensors, shapes, placements, files, step; verifies every checksum
       launcher ckpt convert PATH --to FILE     gather every tensor into one plain safetensors file

PATH is a checkpoint folder (step-N), a folder of checkpoints (the newest), or a
safetensors file.
`

// ckptMain runs `launcher ckpt`. Bad or damaged input exits 2.
func ckptMain(args []string, stdout, stderr io.Writer) int {
	if len(args) < 2 || (args[0] != "inspect" && args[0] != "convert") {
		fmt.Fprint(stderr, ckptUsage)
		return ExitUsage
	}
	fs := flag.NewFlagSet("ckpt", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	to := fs.String("to", "", "the safetensors file convert writes")
	path := args[1]
	if err := fs.Parse(args[2:]); err != nil || fs.NArg() > 0 {
		fmt.Fprintf(stderr, "launcher ckpt: bad flags %v\n%s", args[2:], ckptUsage)
		return ExitUsage
	}
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
		if *to == "" {
			return fail(fmt.Errorf("--to FILE is required"))
		}
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
