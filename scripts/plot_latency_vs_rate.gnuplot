# scripts/plot_latency_vs_rate.gnuplot — latency vs arrival rate from `splitflow bench serve --sweep`
# CSV tables (one series per table, e.g. Dynamic SplitFuse against --no-splitfuse), drawn as SVG:
# rows TTFT, ITL and E2E at p50 / p90 / p99, the SLO limit dashed where one applies; a last row of
# output throughput, goodput and the share of requests within the SLO.
#
#   gnuplot -c scripts/plot_latency_vs_rate.gnuplot OUT.svg TTFT_SLO_MS ITL_SLO_MS CSV1 LABEL1 [CSV2 LABEL2 [CSV3 LABEL3]]
#
# `splitflow bench serve --sweep` runs it itself when gnuplot is on PATH.
if (ARGC < 5 || ARGC % 2 == 0) {
  print "usage: gnuplot -c plot_latency_vs_rate.gnuplot OUT.svg TTFT_SLO_MS ITL_SLO_MS CSV1 LABEL1 [CSV2 LABEL2 [CSV3 LABEL3]]"
  exit status 2
}
out = ARG1
ttft_slo = real(ARG2)
itl_slo = real(ARG3)
series = (ARGC - 3) / 2
csv(i) = value(sprintf("ARG%d", 2 + 2 * i))
label(i) = value(sprintf("ARG%d", 3 + 2 * i))

set datafile separator comma
set datafile columnheaders
set terminal svg size 1500,1500 dynamic font "sans,11"
set output out
set multiplot layout 4,3 title "latency vs arrival rate" font "sans,14"
set grid
set key top left
set xlabel "arrival rate (req/s)"
set linetype 1 lc rgb "#1f77b4" lw 2 pt 7
set linetype 2 lc rgb "#d62728" lw 2 pt 5
set linetype 3 lc rgb "#2ca02c" lw 2 pt 9
set style line 10 lc rgb "#555555" dt 2 lw 1.5

do for [metric in "ttft itl e2e"] {
  do for [q in "p50 p90 p99"] {
    name = sprintf("%s_%s_ms", metric, q)
    set title sprintf("%s %s (ms)", (metric eq "ttft" ? "TTFT" : metric eq "itl" ? "ITL" : "E2E"), q)
    set ylabel "ms"
    set logscale y
    if (metric eq "e2e") {
      plot for [i=1:series] csv(i) using "rate_rps":name with linespoints lt i title label(i)
    } else {
      slo = metric eq "ttft" ? ttft_slo : itl_slo
      plot for [i=1:series] csv(i) using "rate_rps":name with linespoints lt i title label(i), \
           slo with lines ls 10 title sprintf("SLO %g ms", slo)
    }
    unset logscale y
  }
}

set title "output throughput (tokens/s)"
set ylabel "tokens/s"
plot for [i=1:series] csv(i) using "rate_rps":"output_throughput_tps" with linespoints lt i title label(i)
set title "goodput (requests/s within the SLO)"
set ylabel "req/s"
plot for [i=1:series] csv(i) using "rate_rps":"goodput_rps" with linespoints lt i title label(i), \
     x with lines ls 10 title "offered rate"
set title "requests within the SLO (%)"
set ylabel "%"
set yrange [0:105]
plot for [i=1:series] csv(i) using "rate_rps":(100 * column("good_fraction")) with linespoints lt i title label(i)
unset multiplot
