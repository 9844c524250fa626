package command

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline/projector"
)

func runProjectionsRebuild(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	var consumer string
	var restart, verify bool
	var lockTimeout time.Duration
	c, fs, err := parse("projections rebuild", domains, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.StringVar(&consumer, "consumer", "", "the live projector's consumer (default: its domain's projector)")
		fs.BoolVar(&restart, "restart", false, "drop an unfinished rebuild of this projection and start from the beginning (default: resume it)")
		fs.BoolVar(&verify, "verify", false, "print row counts and checksums of the live and rebuilt tables at the swap (locks them while it reads)")
		fs.DurationVar(&lockTimeout, "lock-timeout", 2*time.Second, "longest wait for a lock in the swap (readers wait at most this long behind it)")
	})
	if err != nil {
		return err
	}
	if err := c.requireDatabase(ctx); err != nil {
		return err
	}
	cfg := c.Config
	dep, serdes, err := deploymentSerdes(ctx, cfg)
	if err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("usage: onceflow projections rebuild [flags] NAME (one of: %s)", dep.ProjectionNames())
	}
	d, proj, err := dep.FindProjection(fs.Arg(0))
	if err != nil {
		return err
	}
	if consumer == "" {
		consumer = d.ProjectorConsumer()
	}
	// A rebuild creates and swaps tables: it runs as the migration role,
	// which owns them, when there is one (docs/security.md#database-roles).
	if cfg.DatabaseMigrationURL != "" {
		cfg.DatabaseURL = cfg.DatabaseMigrationURL
	}
	pool, err := cfg.OpenDatabase(ctx, 4)
	if err != nil {
		return err
	}
	defer pool.Close()
	logger := c.Logger
	rb, err := projector.NewRebuild(projector.RebuildConfig{
		Topic: d.EventsTopic(), Consumer: consumer, Projection: proj,
		Restart: restart, Verify: verify, LockTimeout: lockTimeout,
		Progress: func(p projector.RebuildProgress) {
			fmt.Fprintf(stdout, "rebuilding %s: %d events applied, %d offsets behind the live projector\n", proj.Name(), p.Applied, p.Behind)
		},
	}, cfg.Kafka, pool, serdes[d.EventsTopic()], logger)
	if err != nil {
		return err
	}
	res, err := rb.Run(ctx)
	if err != nil {
		return fmt.Errorf("rebuild %s: %w", proj.Name(), err)
	}
	fmt.Fprintf(stdout, "rebuilt %s in %s: %d events applied by this run; swapped at offsets %s\n",
		res.Projection, res.Duration.Round(time.Millisecond), res.Applied, projector.OffsetsText(res.Offsets))
	for _, t := range res.Tables {
		if verify {
			same := "identical"
			if t.LiveChecksum != t.RebuiltChecksum {
				same = "different: the rebuild changed the read model"
			}
			fmt.Fprintf(stdout, "  %s: live %d rows (md5 %s), rebuilt %d rows (md5 %s): %s\n",
				t.Name, t.LiveRows, t.LiveChecksum, t.RebuiltRows, t.RebuiltChecksum, same)
		} else {
			fmt.Fprintf(stdout, "  %s: swapped\n", t.Name)
		}
	}
	if len(res.LiveParked) > 0 {
		parts := make([]string, len(res.LiveParked))
		for i, p := range res.LiveParked {
			parts[i] = strconv.Itoa(int(p))
		}
		fmt.Fprintf(stdout, "the live projector has parked partitions %s: `onceflow projections unpark %s` tries them again against the rebuilt tables\n",
			strings.Join(parts, ", "), strings.Join(parts, " "))
	}
	return nil
}

func runProjectionsUnpark(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	var consumer, domainName string
	c, fs, err := parse("projections unpark", domains, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.StringVar(&consumer, "consumer", "", "the projector's consumer (default: its domain's projector)")
		fs.StringVar(&domainName, "domain", "", "the domain whose projector parked them (default: the only one)")
	})
	if err != nil {
		return err
	}
	var parts []int32
	for _, a := range fs.Args() {
		p, err := strconv.ParseInt(a, 10, 32)
		if err != nil || p < 0 {
			return fmt.Errorf("partition %q: want a partition number", a)
		}
		parts = append(parts, int32(p))
	}
	d, consumer, pool, err := c.parkedProjector(ctx, domainName, consumer)
	if err != nil {
		return err
	}
	defer pool.Close()
	n, err := projector.Unpark(ctx, pool, consumer, d.EventsTopic(), parts)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("no parked partition of %s on %s matched (one parked for its stored offset, topic-changed or offset-out-of-range, is answered by onceflow projections reset)", consumer, d.EventsTopic())
	}
	fmt.Fprintf(stdout, "unparked %d partition(s) of %s; the projector that owns them tries their record again within seconds (it parks again if the cause is still there)\n", n, consumer)
	return nil
}

// runProjectionsSkip is `onceflow projections skip`: projector.Skip, with
// the operator's name from -operator or $USER.
func runProjectionsSkip(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	var consumer, domainName, note, operator string
	c, fs, err := parse("projections skip", domains, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.StringVar(&consumer, "consumer", "", "the projector's consumer (default: its domain's projector)")
		fs.StringVar(&domainName, "domain", "", "the domain whose projector parked it (default: the only one)")
		fs.StringVar(&note, "note", "", "why the record is skipped (required; kept in projector_skips)")
		fs.StringVar(&operator, "operator", getenv("USER"), "who skips it (kept in projector_skips)")
	})
	if err != nil {
		return err
	}
	if fs.NArg() != 2 || note == "" || operator == "" {
		return fmt.Errorf("usage: onceflow projections skip -note WHY [-operator NAME] PARTITION OFFSET (the offset it is parked at: onceflow lag)")
	}
	part, off, err := partitionOffset(fs)
	if err != nil {
		return err
	}
	d, consumer, pool, err := c.parkedProjector(ctx, domainName, consumer)
	if err != nil {
		return err
	}
	defer pool.Close()
	s, err := projector.Skip(ctx, pool, projector.Skipping{Consumer: consumer, Topic: d.EventsTopic(), Partition: part, Offset: off, Note: note, Operator: operator})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "skipped partition %d of %s from %d to %d (parked: %s: %s), recorded in projector_skips; the projector that owns it reads on within seconds\n",
		part, consumer, s.From, s.To, s.Reason, plain(s.Detail))
	return nil
}

func runProjectionsList(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	c, dep, err := parseDeployed("projections list", domains, args, getenv, stdout)
	if err != nil {
		return err
	}
	tw := table(stdout, "DOMAIN\tPROJECTION\tTABLES\tREBUILDABLE")
	for _, d := range dep.Domains {
		for _, p := range d.ReadModels() {
			tables, rebuildable := "-", "no"
			if rb, ok := p.(projector.Rebuildable); ok {
				tables, rebuildable = strings.Join(rb.Tables(), ","), "yes"
			}
			if _, _, err := dep.FindProjection(p.Name()); err != nil {
				rebuildable = "no (every domain's)" // a read model of every domain, in a deployment of several
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", d.Name, p.Name(), tables, rebuildable)
		}
	}
	tw.Flush()
	if err := c.requireDatabase(ctx); err != nil {
		fmt.Fprintf(stdout, "\nrebuilds and parked partitions are not shown: %v\n", err)
		return nil
	}
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	rows, err := pool.Query(ctx, `SELECT projection, consumer, shadow_consumer, state, started_at, finished_at, detail
		FROM projection_rebuilds ORDER BY started_at DESC LIMIT 20`)
	if err != nil {
		return err
	}
	type rebuild struct {
		projection, consumer, shadow, state, detail string
		started                                     time.Time
		finished                                    *time.Time
	}
	var list []rebuild
	var r rebuild
	if _, err := pgx.ForEachRow(rows, []any{&r.projection, &r.consumer, &r.shadow, &r.state, &r.started, &r.finished, &r.detail}, func() error {
		list = append(list, r)
		return nil
	}); err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	if len(list) == 0 {
		fmt.Fprintln(stdout, "rebuilds: none")
	} else {
		tw = table(stdout, "REBUILD\tPROJECTION\tSTATE\tSTARTED\tFINISHED\tDETAIL")
		for _, r := range list {
			fin := "-"
			if r.finished != nil {
				fin = r.finished.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.shadow, r.projection, r.state, r.started.UTC().Format(time.RFC3339), fin, r.detail)
		}
		tw.Flush()
	}
	parked, err := projector.Parked(ctx, pool)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nparked partitions: %d", len(parked))
	if len(parked) > 0 {
		fmt.Fprint(stdout, " (details: onceflow lag)")
	}
	fmt.Fprintln(stdout)
	return nil
}

// parkedProjector finds what unpark and skip act on: the domain (the only
// one when domainName is empty), its projector's consumer unless one is
// named, and a connection to the database that holds the parked
// partitions.
func (c *config) parkedProjector(ctx context.Context, domainName, consumer string) (*onceflow.DeployedDomain, string, *pgxpool.Pool, error) {
	dep, err := c.Deployment()
	if err != nil {
		return nil, "", nil, err
	}
	d, err := dep.FindDomain(domainName)
	if err != nil {
		return nil, "", nil, err
	}
	if consumer == "" {
		consumer = d.ProjectorConsumer()
	}
	pool, err := c.connect(ctx)
	if err != nil {
		return nil, "", nil, err
	}
	return d, consumer, pool, nil
}

// partitionOffset reads the PARTITION OFFSET arguments of a skip.
func partitionOffset(fs *flag.FlagSet) (int32, int64, error) {
	part, perr := strconv.ParseInt(fs.Arg(0), 10, 32)
	off, oerr := strconv.ParseInt(fs.Arg(1), 10, 64)
	if perr != nil || oerr != nil || part < 0 || off < 0 {
		return 0, 0, fmt.Errorf("partition %q, offset %q: want two numbers", fs.Arg(0), fs.Arg(1))
	}
	return int32(part), off, nil
}
