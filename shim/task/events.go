package task

import (
	"context"
	"sync"

	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/sirupsen/logrus"
)

// eventQueue hands events to the publisher (containerd's event endpoint) in
// the order they were queued, from one goroutine, so that no RPC and no exit
// waits for containerd to take an event. containerd can be slow to answer or
// gone (restarting: pkg/shim's publisher then redials and retries, several
// seconds per event), and what a client waits for must not depend on it: a
// Wait that returned only once the exit event was published hung with the
// publisher. containerd's runc shim queues its events the same way.
type eventQueue struct {
	publish func(ctx context.Context, topic string, ev events.Event) error
	log     *logrus.Entry

	mu      sync.Mutex
	pending []queuedEvent
	running bool // a forwarder goroutine is draining pending
	queued  uint64
	done    uint64        // events handed to publish (returned, with or without error)
	advance chan struct{} // closed and replaced each time done grows
}

type queuedEvent struct {
	ctx   context.Context
	topic string
	ev    events.Event
}

func newEventQueue(publish func(context.Context, string, events.Event) error, log *logrus.Entry) *eventQueue {
	return &eventQueue{publish: publish, log: log, advance: make(chan struct{})}
}

// push queues an event and returns at once. ctx must already carry the
// namespace and no deadline (the event outlives the RPC that made it).
func (q *eventQueue) push(ctx context.Context, topic string, ev events.Event) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.pending = append(q.pending, queuedEvent{ctx, topic, ev})
	q.queued++
	if !q.running {
		q.running = true
		go q.forward()
	}
}

// forward publishes the pending events one by one until none is left.
func (q *eventQueue) forward() {
	for {
		q.mu.Lock()
		if len(q.pending) == 0 {
			q.running = false
			q.mu.Unlock()
			return
		}
		e := q.pending[0]
		q.pending[0] = queuedEvent{}
		q.pending = q.pending[1:]
		q.mu.Unlock()

		if err := q.publish(e.ctx, e.topic, e.ev); err != nil {
			q.log.WithError(err).WithField("topic", e.topic).Error("publish event")
		}

		q.mu.Lock()
		q.done++
		close(q.advance)
		q.advance = make(chan struct{})
		q.mu.Unlock()
	}
}

// flush waits until every event queued before the call has been handed to
// the publisher, or ctx ends.
func (q *eventQueue) flush(ctx context.Context) error {
	q.mu.Lock()
	target := q.queued
	for q.done < target {
		adv := q.advance
		q.mu.Unlock()
		select {
		case <-adv:
		case <-ctx.Done():
			return ctx.Err()
		}
		q.mu.Lock()
	}
	q.mu.Unlock()
	return nil
}

// FlushEvents waits until every event the service queued so far has been
// handed to its publisher (published, or failed and logged), or ctx ends.
// Events go out asynchronously, in order; this is for a caller that must see
// them delivered (the shim's shutdown, tests).
func (s *Service) FlushEvents(ctx context.Context) error {
	return s.events.flush(ctx)
}

func (s *Service) publish(ctx context.Context, topic string, ev events.Event) {
	if s.o.Publisher == nil {
		return
	}
	// Events must not carry the RPC's deadline (publishing outlives it), and
	// must name the namespace: exits are published from no RPC at all.
	s.events.push(namespaces.WithNamespace(context.WithoutCancel(ctx), s.o.Namespace), topic, ev)
}
