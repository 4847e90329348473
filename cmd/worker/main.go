// Command worker runs one rank of a meshrun job; the launcher starts one per rank
// with RANK, WORLD_SIZE and the other variables set.
//
//	worker hello              print the rank, log one line, exit 0
//	worker exit CODE [RANK]   exit CODE (only on rank RANK; the others wait to be stopped)
//	worker sleep DUR          sleep DUR, exit 0
package main

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"go.uber.org/zap"
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: worker hello | exit CODE [RANK] | sleep DUR")
		return 2
	}
	rank, world := os.Getenv("RANK"), os.Getenv("WORLD_SIZE")
	switch args[0] {
	case "hello":
		fmt.Printf("hello from rank %s of %s\n", rank, world)
		log, err := zap.NewProduction()
		if err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			return 1
		}
		log.Info("hello", zap.String("job", os.Getenv("MESHRUN_JOB_ID")), zap.String("rank", rank), zap.Int("pid", os.Getpid()))
		log.Sync()
		return 0
	case "exit":
		if len(args) < 2 {
			break
		}
		code, err := strconv.Atoi(args[1])
		if err != nil {
			break
		}
		if len(args) > 2 && args[2] != rank {
			time.Sleep(time.Hour) // a healthy peer, until the launcher stops it
			return 0
		}
		time.Sleep(100 * time.Millisecond)
		fmt.Fprintf(os.Stderr, "rank %s: exiting with code %d\n", rank, code)
		return code
	case "sleep":
		if len(args) < 2 {
			break
		}
		d, err := time.ParseDuration(args[1])
		if err != nil {
			break
		}
		time.Sleep(d)
		return 0
	}
	fmt.Fprintf(os.Stderr, "worker: bad workload %q\n", args)
	return 2
}
