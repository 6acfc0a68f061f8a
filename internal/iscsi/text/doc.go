// Package text is iSCSI's key=value text codec and negotiation rules
// (RFC 7143 chapters 6 and 13): NUL-separated key=value parsing with the
// RFC's bounds, order-preserving encoding, an Accumulator for texts that
// continue across PDUs (C bit), and the negotiation of operational keys
// from a table (Keys) giving each key's kind, default and range.
//
// Simplest use, a target answering a Login Request's operational keys:
//
//	pairs, err := text.Parse(loginData)        // ErrDuplicate, ErrTooLong, ErrSyntax
//	p := text.Defaults()
//	answers := text.Negotiate(&p, pairs, map[string]string{"HeaderDigest": "CRC32C,None"}, false)
//	answers = append(answers, text.Pair{Key: "MaxRecvDataSegmentLength", Value: "262144"})
//	data, _ := text.Append(nil, answers...)
//
// The rules: list keys take the first value of the offerer's list that the
// responder supports (HeaderDigest, DataDigest, AuthMethod); Boolean keys
// AND (ImmediateData) or OR (InitialR2T, DataPDUInOrder,
// DataSequenceInOrder); numerical keys take the minimum (MaxBurstLength,
// FirstBurstLength, MaxConnections, DefaultTime2Retain, MaxOutstandingR2T,
// ErrorRecoveryLevel) or maximum (DefaultTime2Wait); declarative keys
// (MaxRecvDataSegmentLength, InitiatorName, TargetAlias...) owe no answer.
// Invalid values are answered Reject, unknown keys NotUnderstood, keys
// that do not apply to a discovery session Irrelevant. Settle is the
// offerer's side and checks that an answer obeys the rule.
//
// The package does no I/O and has no mutable state except the Keys table,
// which is filled at init and must not be modified; all functions are safe
// for concurrent use.
package text
