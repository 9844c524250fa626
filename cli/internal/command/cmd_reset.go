package command

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline/projector"
)

// runProjectionsReset is `onceflow projections reset`: projector.Reset,
// with the operator's name from -operator or $USER.
func runProjectionsReset(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	var consumer, domainName, from, note, operator string
	c, fs, err := parse("projections reset", domains, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.StringVar(&consumer, "consumer", "", "the projector's consumer (default: its domain's projector)")
		fs.StringVar(&domainName, "domain", "", "the domain whose projector parked them (default: the only one)")
		fs.StringVar(&from, "from", "", "where the partitions read from now: start (each partition's log start on the topic as it is now) or an offset (required)")
		fs.StringVar(&note, "note", "", "why (required; kept in projector_resets)")
		fs.StringVar(&operator, "operator", getenv("USER"), "who resets them (kept in projector_resets)")
	})
	if err != nil {
		return err
	}
	usage := fmt.Errorf("usage: onceflow projections reset -from start|OFFSET -note WHY [-operator NAME] all|PARTITION... (partitions parked topic-changed or offset-out-of-range: onceflow lag)")
	if fs.NArg() == 0 || from == "" || note == "" || operator == "" {
		return usage
	}
	r := projector.Resetting{From: projector.FromStart, Note: note, Operator: operator}
	if from != "start" {
		if r.From, err = strconv.ParseInt(from, 10, 64); err != nil || r.From < 0 {
			return fmt.Errorf("-from %q: want start or an offset", from)
		}
	}
	if !(fs.NArg() == 1 && fs.Arg(0) == "all") {
		for _, a := range fs.Args() {
			p, err := strconv.ParseInt(a, 10, 32)
			if err != nil || p < 0 {
				return fmt.Errorf("partition %q: want all or partition numbers", a)
			}
			r.Partitions = append(r.Partitions, int32(p))
		}
	}
	d, consumer, pool, err := c.parkedProjector(ctx, domainName, consumer)
	if err != nil {
		return err
	}
	defer pool.Close()
	cl, err := c.Config.Kafka.NewClient()
	if err != nil {
		return err
	}
	defer cl.Close()
	r.Consumer, r.Topic = consumer, d.EventsTopic()
	done, err := projector.Reset(ctx, pool, cl, r)
	if err != nil {
		return err
	}
	for _, x := range done {
		fmt.Fprintf(stdout, "reset partition %d of %s from %d to %d (parked: %s), recorded in projector_resets\n", x.Partition, consumer, x.From, x.To, x.Reason)
	}
	fmt.Fprintf(stdout, "the projector that owns them reads from there within seconds\n")
	return nil
}
