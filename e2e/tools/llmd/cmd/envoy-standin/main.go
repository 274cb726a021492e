// Command envoy-standin is a STAND-IN FOR ENVOY on the llm-d request path of the e2e suites: no Envoy
// binary can be installed where they run, so this client plays the part Envoy plays in front of
// llm-d's endpoint picker (EPP), the way the Gateway API Inference Extension's own hermetic tests drive
// it. It does real work, over the real protocol:
//
//  1. opens an ext_proc stream (envoy.service.ext_proc.v3, gRPC) to the EPP and sends the request's
//     headers and then its body (end of stream), as Envoy does in FULL_DUPLEX_STREAMED body mode;
//  2. reads the EPP's answer: the request-header mutation (x-gateway-destination-endpoint,
//     x-prefiller-host-port, ...), the destination in the envoy.lb dynamic metadata, and the streamed
//     body mutation; an ImmediateResponse (the EPP refusing) ends the request with its status;
//  3. sends the request, mutated, to the endpoint the EPP picked, as Envoy's original-destination
//     cluster would, and
//  4. reports the response's headers and body back on the stream, so the EPP's response plugins run.
//
// It prints one JSON object (what the EPP decided and what the endpoint answered) on stdout. It never
// dials an address outside -allow-cidr (loopback by default): test traffic stays on the machine.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

const (
	destinationKey       = "x-gateway-destination-endpoint"
	destinationNamespace = "envoy.lb"
)

// Result is what the stand-in prints: the EPP's decision and the endpoint's answer.
type Result struct {
	// Destination is the endpoint (ip:port) the EPP picked; empty when it refused the request.
	Destination string `json:"destination"`
	// Headers are the request headers the EPP set (its header mutation), lower-cased.
	Headers map[string]string `json:"headers"`
	// EPPStatus is the HTTP status of the EPP's ImmediateResponse when it refused the request, else 0.
	EPPStatus int `json:"eppStatus"`
	// EPPBody is the body of that ImmediateResponse.
	EPPBody string `json:"eppBody,omitempty"`
	// Status is the endpoint's HTTP status (0 when the request never reached one).
	Status int `json:"status"`
	// Body is the endpoint's response body: JSON when it parses, else a string.
	Body any `json:"body,omitempty"`
}

type headerList []string

func (h *headerList) String() string     { return strings.Join(*h, ",") }
func (h *headerList) Set(v string) error { *h = append(*h, v); return nil }

func main() {
	epp := flag.String("epp", "127.0.0.1:9002", "the EPP's ext_proc gRPC address (host:port)")
	eppTLS := flag.Bool("epp-tls", true, "speak TLS to the EPP (its --secure-serving default); its "+
		"self-signed certificate is not verified, as Envoy's config in llm-d's guides does not")
	path := flag.String("path", "/v1/completions", "request path")
	host := flag.String("authority", "gateway.local", "the :authority the request carries")
	bodyFile := flag.String("body", "-", "file holding the JSON request body ('-': stdin)")
	allow := flag.String("allow-cidr", "127.0.0.0/8", "the only network the picked endpoint may be in")
	timeout := flag.Duration("timeout", 60*time.Second, "whole-request deadline")
	var extra headerList
	flag.Var(&extra, "header", "an extra request header 'name: value' (repeatable)")
	flag.Parse()

	body, err := readBody(*bodyFile)
	if err != nil {
		fail(err)
	}
	prefix, err := netip.ParsePrefix(*allow)
	if err != nil {
		fail(fmt.Errorf("-allow-cidr %q: %w", *allow, err))
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	res, err := run(ctx, *epp, *eppTLS, *path, *host, extra, body, prefix)
	if err != nil {
		fail(err)
	}
	out := json.NewEncoder(os.Stdout)
	out.SetIndent("", "  ")
	if err := out.Encode(res); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "envoy-standin: %v\n", err)
	os.Exit(1)
}

func readBody(name string) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(os.Stdin)
	}
	return os.ReadFile(name)
}

func run(ctx context.Context, epp string, useTLS bool, path, authority string, extra []string,
	body []byte, allow netip.Prefix) (*Result, error) {
	creds := insecure.NewCredentials()
	if useTLS {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the EPP's self-signed serving cert
	}
	conn, err := grpc.NewClient(epp, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("dial EPP %s: %w", epp, err)
	}
	defer conn.Close()
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		return nil, fmt.Errorf("open ext_proc stream to %s: %w", epp, err)
	}

	reqHeaders := map[string]string{
		":method": "POST", ":path": path, ":authority": authority, ":scheme": "http",
		"content-type": "application/json", "content-length": fmt.Sprint(len(body)),
	}
	for _, h := range extra {
		k, v, ok := strings.Cut(h, ":")
		if !ok {
			return nil, fmt.Errorf("-header %q: want 'name: value'", h)
		}
		reqHeaders[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
	}
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: headerMap(reqHeaders)},
	}}); err != nil {
		return nil, fmt.Errorf("send request headers: %w", err)
	}
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true},
	}}); err != nil {
		return nil, fmt.Errorf("send request body: %w", err)
	}

	res := &Result{Headers: map[string]string{}}
	var newBody []byte
	for done := false; !done; {
		resp, err := stream.Recv()
		if err != nil {
			return nil, fmt.Errorf("receive from EPP: %w", err)
		}
		switch r := resp.Response.(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			res.EPPStatus = int(r.ImmediateResponse.GetStatus().GetCode())
			res.EPPBody = string(r.ImmediateResponse.GetBody())
			return res, nil
		case *extprocv3.ProcessingResponse_RequestHeaders:
			for _, h := range r.RequestHeaders.GetResponse().GetHeaderMutation().GetSetHeaders() {
				v := h.GetHeader().GetRawValue()
				if v == nil {
					v = []byte(h.GetHeader().GetValue())
				}
				res.Headers[strings.ToLower(h.GetHeader().GetKey())] = string(v)
			}
			if lb := resp.GetDynamicMetadata().GetFields()[destinationNamespace]; lb != nil {
				res.Destination = lb.GetStructValue().GetFields()[destinationKey].GetStringValue()
			}
		case *extprocv3.ProcessingResponse_RequestBody:
			m := r.RequestBody.GetResponse().GetBodyMutation()
			switch {
			case m.GetStreamedResponse() != nil:
				newBody = append(newBody, m.GetStreamedResponse().GetBody()...)
				done = m.GetStreamedResponse().GetEndOfStream()
			case m.GetBody() != nil:
				newBody, done = m.GetBody(), true
			default:
				newBody, done = body, true
			}
		default:
			return nil, fmt.Errorf("unexpected ext_proc response %T before the request was routed", r)
		}
	}
	if res.Destination == "" {
		// Envoy's original-destination cluster also accepts the header.
		res.Destination = res.Headers[destinationKey]
	}
	if res.Destination == "" {
		return nil, errors.New("the EPP routed the request without naming a destination endpoint")
	}
	if hdr := res.Headers[destinationKey]; hdr != "" && hdr != res.Destination {
		return nil, fmt.Errorf("EPP metadata names %s but its header %s", res.Destination, hdr)
	}
	if err := allowed(res.Destination, allow); err != nil {
		return nil, err
	}

	status, respHeaders, respBody, err := forward(ctx, res.Destination, path, reqHeaders, res.Headers, newBody)
	if err != nil {
		return nil, err
	}
	res.Status = status
	var parsed any
	if json.Unmarshal(respBody, &parsed) == nil {
		res.Body = parsed
	} else {
		res.Body = string(respBody)
	}
	// The response phase, so the EPP's response plugins (and its request bookkeeping) run.
	respHeaders[":status"] = fmt.Sprint(status)
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerMap(respHeaders)},
	}}); err != nil {
		return nil, fmt.Errorf("send response headers: %w", err)
	}
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: respBody, EndOfStream: true},
	}}); err != nil {
		return nil, fmt.Errorf("send response body: %w", err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return nil, fmt.Errorf("receive the EPP's response processing: %w", err)
		}
		if rb, ok := resp.Response.(*extprocv3.ProcessingResponse_ResponseBody); ok {
			if sr := rb.ResponseBody.GetResponse().GetBodyMutation().GetStreamedResponse(); sr == nil || sr.GetEndOfStream() {
				break
			}
		}
	}
	_ = stream.CloseSend()
	return res, nil
}

func headerMap(h map[string]string) *corev3.HeaderMap {
	out := &corev3.HeaderMap{}
	for k, v := range h {
		out.Headers = append(out.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	return out
}

func allowed(endpoint string, allow netip.Prefix) error {
	ap, err := netip.ParseAddrPort(endpoint)
	if err != nil {
		return fmt.Errorf("the EPP picked %q, which is not ip:port: %w", endpoint, err)
	}
	if !allow.Contains(ap.Addr()) {
		return fmt.Errorf("the EPP picked %s, outside %s: refusing to send test traffic there", endpoint, allow)
	}
	return nil
}

// forward sends the mutated request to the picked endpoint: the original headers with the EPP's
// mutation applied over them (pseudo-headers and Content-Length are the HTTP client's business).
func forward(ctx context.Context, dest, path string, orig, mutation map[string]string, body []byte) (
	int, map[string]string, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+dest+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	for _, hs := range []map[string]string{orig, mutation} {
		for k, v := range hs {
			if strings.HasPrefix(k, ":") || strings.EqualFold(k, "content-length") {
				continue
			}
			req.Header.Set(k, v)
		}
	}
	client := &http.Client{Transport: &http.Transport{
		Proxy:       nil, // never through a proxy from the environment
		DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
	}}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("forward to %s: %w", dest, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("read response of %s: %w", dest, err)
	}
	hs := map[string]string{}
	for k := range resp.Header {
		hs[strings.ToLower(k)] = resp.Header.Get(k)
	}
	return resp.StatusCode, hs, b, nil
}
