package kafka

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Resource is the kind of Kafka resource an ACL names.
type Resource int8

const (
	Topic Resource = iota
	Group
	TransactionalID
)

func (r Resource) String() string {
	switch r {
	case Topic:
		return "topic"
	case Group:
		return "group"
	case TransactionalID:
		return "transactional id"
	}
	return fmt.Sprintf("resource(%d)", int8(r))
}

// Need is an operation a component needs on a resource: what an ACL must
// allow its principal (docs/security.md#kafka-acls).
type Need struct {
	Resource Resource
	Name     string
	Op       kadm.ACLOperation // kadm.OpRead or kadm.OpWrite
}

func (n Need) String() string {
	op := strings.ToLower(n.Op.String())
	return strings.ToUpper(op[:1]) + op[1:] + " on " + n.Resource.String() + " " + n.Name
}

// AccessError is a principal refused what its role needs: the component
// cannot work, so it does not start (CheckAccess).
type AccessError struct {
	Role      string // the component: "relay", "processor", "projector"
	Principal string // "User:name", or "" without SASL
	Missing   []Need
}

// maxNamed is how many of the missing operations an AccessError names:
// a relay refused its transactional ids misses one per shard.
const maxNamed = 10

func (e *AccessError) Error() string {
	who := "its principal"
	if e.Principal != "" {
		who = e.Principal
	}
	var missing []string
	for i, n := range e.Missing {
		if i == maxNamed && len(e.Missing) > maxNamed+1 {
			missing = append(missing, fmt.Sprintf("and %d more", len(e.Missing)-i))
			break
		}
		missing = append(missing, n.String())
	}
	return fmt.Sprintf("kafka: the %s's principal %s is not allowed %s: grant the %s's ACLs (docs/security.md#kafka-acls, scripts/kafka-acls.sh)",
		e.Role, who, strings.Join(missing, ", "), e.Role)
}

// Principal is the Kafka principal the configuration authenticates as,
// "" when it does not use SASL (the broker then names it by the listener:
// ANONYMOUS, or a TLS certificate's subject).
func (c Config) Principal() string {
	if c.SASLMechanism == "" {
		return ""
	}
	return "User:" + c.SASLUser
}

// CheckAccess asks the cluster whether cl's principal may do each of
// needs, and returns an *AccessError naming those it may not, or nil. A
// component checks at start what it would otherwise learn at its first
// produce, join or transaction, where an authorization error is retried
// and logged forever (franz-go retries a group join; a refused
// transactional id fails every batch).
//
// Topics are asked with a metadata request that includes the operations
// the principal is allowed on each (KIP-430); groups with a group
// description that includes them. Transactional ids have no such answer:
// describing the transaction needs Describe, which Write implies, so a
// principal that may not describe it may not write it, while one allowed
// only Describe passes here and is refused at its first transaction.
// What the cluster does not report (no authorizer, a broker that omits
// the operations, a group not made yet) passes: only a refusal fails.
func CheckAccess(ctx context.Context, cl *kgo.Client, role, principal string, needs []Need) error {
	var missing []Need
	var topics []string
	for _, n := range needs {
		if n.Resource == Topic && !slices.Contains(topics, n.Name) {
			topics = append(topics, n.Name)
		}
	}
	allowed := map[Need]bool{}
	if len(topics) > 0 {
		req := kmsg.NewPtrMetadataRequest()
		req.IncludeTopicAuthorizedOperations = true
		for _, t := range topics {
			rt := kmsg.NewMetadataRequestTopic()
			rt.Topic = kmsg.StringPtr(t)
			req.Topics = append(req.Topics, rt)
		}
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			return fmt.Errorf("kafka: check the %s's access: %w", role, err)
		}
		for _, t := range resp.Topics {
			if t.Topic == nil {
				continue
			}
			for _, op := range operations(t.ErrorCode, t.AuthorizedOperations, kerr.TopicAuthorizationFailed) {
				allowed[Need{Topic, *t.Topic, op}] = true
			}
		}
	}
	adm := kadm.NewClient(cl)
	for _, n := range needs {
		switch n.Resource {
		case Topic:
			if !allowed[n] && !allowed[Need{Topic, n.Name, kadm.OpAll}] {
				missing = append(missing, n)
			}
		case Group:
			described, err := adm.DescribeGroups(ctx, n.Name)
			if err == nil {
				if g, ok := described[n.Name]; ok {
					err = g.Err
					if err == nil && len(g.AuthorizedOperations) > 0 &&
						!slices.Contains(g.AuthorizedOperations, n.Op) && !slices.Contains(g.AuthorizedOperations, kadm.OpAll) {
						missing = append(missing, n)
					}
				}
			}
			if errors.Is(err, kerr.GroupAuthorizationFailed) {
				missing = append(missing, n)
			}
		case TransactionalID:
			described, err := adm.DescribeTransactions(ctx, n.Name)
			if err == nil {
				if t, ok := described[n.Name]; ok {
					err = t.Err
				}
			}
			if errors.Is(err, kerr.TransactionalIDAuthorizationFailed) {
				missing = append(missing, n)
			}
		}
	}
	if len(missing) > 0 {
		return &AccessError{Role: role, Principal: principal, Missing: missing}
	}
	return nil
}

// operations are the operations a topic's metadata reports the principal
// allowed: none when refused (code), every one when not reported.
func operations(code int16, bits int32, refused *kerr.Error) []kadm.ACLOperation {
	if err := kerr.ErrorForCode(code); errors.Is(err, refused) {
		return nil
	}
	if bits == math.MinInt32 || bits == 0 {
		return []kadm.ACLOperation{kadm.OpAll}
	}
	return kadm.DecodeACLOperations(bits)
}
