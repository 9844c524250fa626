package onceflow

import (
	"fmt"
	"strings"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/schemas"
)

// eventsSchema is the domain's events schema with the outcome records
// added when it lacks them, and the Go types of its records.
func (d *DeployedDomain) eventsSchema() (string, map[string]any, error) {
	text := d.Events.Avro
	names, err := avro.RecordNames(text)
	if err != nil {
		return "", nil, fmt.Errorf("domain %s: events schema: %w", d.Name, err)
	}
	types := append([]pipeline.Message{pipeline.CommandRejected{}, pipeline.CommandFailed{}}, d.Events.Types...)
	if !hasRecord(names, "CommandRejected") || !hasRecord(names, "CommandFailed") {
		if hasRecord(names, "CommandRejected") || hasRecord(names, "CommandFailed") {
			return "", nil, fmt.Errorf("domain %s: the events schema declares only one of CommandRejected and CommandFailed; declare both or neither", d.Name)
		}
		ns := ""
		if i := strings.LastIndex(names[0], "."); i >= 0 {
			ns = names[0][:i]
		}
		trimmed := strings.TrimSpace(text)
		if !strings.HasSuffix(trimmed, "]") {
			return "", nil, fmt.Errorf("domain %s: the events schema must be a union (a JSON array) of records", d.Name)
		}
		text = strings.TrimSuffix(trimmed, "]") + ",\n  " + schemas.OutcomeRecords(ns) + "\n]"
		if names, err = avro.RecordNames(text); err != nil {
			return "", nil, fmt.Errorf("domain %s: events schema: %w", d.Name, err)
		}
	}
	m, err := typeMap(names, types)
	if err != nil {
		return "", nil, fmt.Errorf("domain %s: events schema: %w", d.Name, err)
	}
	return text, m, nil
}

// CommandsSchema is the aggregate type's commands schema and its Go types.
func (a *DeployedAggregate) CommandsSchema() (string, map[string]any, error) {
	names, err := avro.RecordNames(a.commands.Avro)
	if err != nil {
		return "", nil, fmt.Errorf("%s: commands schema: %w", a, err)
	}
	m, err := typeMap(names, a.commands.Types)
	if err != nil {
		return "", nil, fmt.Errorf("%s: commands schema: %w", a, err)
	}
	for _, ct := range a.commandTypes {
		if !hasRecord(names, ct) {
			return "", nil, fmt.Errorf("%s: the decider handles %s, which the commands schema has no record for", a, ct)
		}
	}
	return a.commands.Avro, m, nil
}

// stateSchema is the aggregate type's snapshot schema and its Go type.
func (a *DeployedAggregate) stateSchema() (string, map[string]any, error) {
	if _, err := avro.RecordNames(a.state); err != nil {
		return "", nil, fmt.Errorf("%s: state schema: %w", a, err)
	}
	return pipeline.SnapshotSchema(a.state), map[string]any{"onceflow.Snapshot": a.stateType}, nil
}

func (a *DeployedAggregate) String() string { return a.Domain.Name + "/" + a.name }

// typeMap maps each record's full name to the Go type whose MessageType
// names it.
func typeMap(names []string, types []pipeline.Message) (map[string]any, error) {
	m := make(map[string]any, len(names))
	for _, t := range types {
		mt := t.MessageType()
		found := false
		for _, n := range names {
			if n == mt || strings.HasSuffix(n, "."+mt) {
				m[n] = t
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("no record for the Go type %T (%s)", t, mt)
		}
	}
	for _, n := range names {
		if m[n] == nil {
			return nil, fmt.Errorf("record %s has no Go type: list a zero value of it in the Schema's Types", n)
		}
	}
	return m, nil
}

func hasRecord(names []string, short string) bool {
	for _, n := range names {
		if n == short || strings.HasSuffix(n, "."+short) {
			return true
		}
	}
	return false
}
