package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
)

// Submit a job, wait for its result, then submit it again and get the
// answer from the result cache.
func Example() {
	env, err := startExampleEnv() // a Kiln API on real Redis and NATS
	if err != nil {
		log.Fatal(err)
	}
	defer env.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() { _ = env.work(ctx, "hello\n", 0) }() // stands in for `kiln worker`

	c, err := client.New(env.URL)
	if err != nil {
		log.Fatal(err)
	}
	spec := job.Spec{Code: `print("hello")`}
	sub, err := c.Submit(ctx, spec)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("accepted:", sub.Accepted, sub.Status)

	res, err := c.Wait(ctx, sub.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s exit=%d stdout=%q\n", res.Status, res.Code(), res.Stdout)

	again, err := c.Submit(ctx, spec)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("cache hit:", again.CacheHit, again.Stdout == res.Stdout)
	// Output:
	// accepted: true queued
	// succeeded exit=0 stdout="hello\n"
	// cache hit: true true
}

// API errors are *client.Error values naming the field to fix.
func ExampleError() {
	env, err := startExampleEnv()
	if err != nil {
		log.Fatal(err)
	}
	defer env.Close()
	c, err := client.New(env.URL)
	if err != nil {
		log.Fatal(err)
	}
	_, err = c.Submit(context.Background(), job.Spec{Code: "print(1)", Limits: job.Limits{MemoryMB: 1 << 20}})
	var apiErr *client.Error
	if errors.As(err, &apiErr) {
		fmt.Println(apiErr.Status, apiErr.Field)
		fmt.Println(apiErr.Detail)
	}
	// Output:
	// 422 limits.memory_mb
	// memory_mb is 1048576; the maximum is 4096
}
