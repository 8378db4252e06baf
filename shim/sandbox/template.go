package sandbox

import (
	"context"
	"time"

	"github.com/sirupsen/logrus"
)

// chooseTemplate sets o.Template from TemplateFor when a template can
// serve this sandbox, and logs why not when it cannot.
func (s *Sandbox) chooseTemplate(ctx context.Context) {
	if s.o.TemplateFor == nil || s.o.Template != "" || s.restore != nil {
		return
	}
	if s.o.Network != nil {
		// A template VM has no NIC, and a restored VM cannot gain one.
		s.o.Log.Info("cold boot: the sandbox has a network (its VM needs a NIC) and automatic templates have none")
		return
	}
	start := time.Now()
	dir, err := s.o.TemplateFor(ctx)
	if err != nil {
		s.o.Log.WithError(err).Warn("cold boot: no template")
		return
	}
	s.o.Log.WithFields(logrus.Fields{"template": dir, "took": time.Since(start).Round(time.Millisecond)}).Info("restoring from template")
	s.o.Template = dir
}
