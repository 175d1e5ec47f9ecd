// Command hello is built by testkit's tests.
package main

import "fmt"

func main() { fmt.Println("hello from testkit") }
